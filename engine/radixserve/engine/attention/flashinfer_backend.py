"""The FlashInfer attention backend: its paged decode and prefill wrappers over our KV pool.

FlashInfer is imported when the backend is built (a clear error if it is not installed); the
registry and the CPU path never import it. The pool's `[slots, Hkv, D]` buffers are viewed as
FlashInfer pages of one token (`[slots, 1, Hkv, D]`, NHD), as SGLang does, so the per-token KV
indices of `kv_rows` are the page indices whatever the allocator's page size. Per forward batch
`init_forward_metadata` plans one wrapper (decode: `BatchDecodeWithPagedKVCacheWrapper`;
extend/mixed: `BatchPrefillWithPagedKVCacheWrapper`, causal, over prefix + new tokens after the
new K/V are stored) and every layer runs the planned wrapper. The new K/V are written with the
pool's own `set_kv_buffer`.

Not here yet: CUDA graphs (FlashInfer needs its use_cuda_graph wrappers, one per captured batch
size; the graph runner refuses this backend and decode runs eagerly), soft-cap, sliding window.
Never run: the GPU machine this project borrows has no flashinfer (see docs/engine.md).
"""

from __future__ import annotations

from typing import Any

import torch

from radixserve.engine.attention.base import AttentionBackend
from radixserve.engine.attention.spec import AttentionSpec
from radixserve.engine.forward_batch import AttentionLayer, ForwardBatch

WORKSPACE_BYTES = 256 * 1024 * 1024  # SGLang's default float workspace for these wrappers


def import_flashinfer() -> Any:
    try:
        import flashinfer  # type: ignore[import-not-found]
    except ImportError as exc:
        raise ImportError(
            "attention_backend=flashinfer needs the flashinfer package "
            "(pip install flashinfer-python, matching your torch/CUDA); "
            "--attention-backend triton needs nothing extra"
        ) from exc
    return flashinfer


class FlashInferAttnBackend(AttentionBackend):
    def __init__(self, spec: AttentionSpec) -> None:
        if spec.device.type != "cuda":
            raise ValueError("attention_backend=flashinfer runs on CUDA devices only")
        fi = import_flashinfer()
        self.spec = spec
        workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=spec.device)
        self._decode = fi.BatchDecodeWithPagedKVCacheWrapper(
            workspace, "NHD", use_tensor_cores=spec.num_heads // spec.num_kv_heads >= 4
        )
        self._prefill = fi.BatchPrefillWithPagedKVCacheWrapper(workspace, "NHD")
        self._wrapper: Any = None

    def _plan_args(self, fb: ForwardBatch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(kv_indptr, kv_indices, last_page_len) over each request's whole sequence."""
        from radixserve.kernels.layout import build_kv_indices

        ids = torch.arange(fb.batch_size, device=fb.seq_lens.device)
        idx = build_kv_indices(fb.kv_rows, ids, fb.seq_lens)
        last = torch.ones(fb.batch_size, dtype=torch.int32, device=fb.seq_lens.device)
        return idx.kv_indptr, idx.kv_indices, last

    def init_forward_metadata(self, forward_batch: ForwardBatch) -> None:
        # Planning needs the layers' scale: done at the first layer of this forward.
        self._wrapper = None

    def _plan(self, fb: ForwardBatch, scale: float) -> Any:
        s = self.spec
        indptr, indices, last = self._plan_args(fb)
        common: dict[str, Any] = {
            "q_data_type": s.dtype,
            "kv_data_type": s.dtype,
            "sm_scale": scale,
        }
        if fb.forward_mode.is_decode():
            self._decode.plan(
                indptr, indices, last, s.num_heads, s.num_kv_heads, s.head_dim, 1, **common
            )
            return self._decode
        qo = [0]
        for n in fb.extend_seq_lens_cpu:
            qo.append(qo[-1] + n)
        qo_indptr = torch.tensor(qo, dtype=torch.int32, device=fb.seq_lens.device)
        self._prefill.plan(
            qo_indptr, indptr, indices, last, s.num_heads, s.num_kv_heads, s.head_dim, 1,
            causal=True, **common,
        )  # fmt: skip
        return self._prefill

    def _run(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: AttentionLayer,
        fb: ForwardBatch,
    ) -> torch.Tensor:  # fmt: skip
        k_buf, v_buf = self._write_kv(k, v, layer, fb)
        if self._wrapper is None:
            self._wrapper = self._plan(fb, layer.scaling)
        cache = (k_buf.unsqueeze(1), v_buf.unsqueeze(1))  # pages of one token, NHD
        q = q.reshape(-1, layer.num_heads, layer.head_dim).contiguous()  # q may be a qkv view
        out: torch.Tensor = self._wrapper.run(q, cache)
        return out.view(-1, layer.num_heads * layer.head_dim)

    def forward_extend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        layer: AttentionLayer,
        forward_batch: ForwardBatch,
    ) -> torch.Tensor:
        return self._run(q, k, v, layer, forward_batch)

    def forward_decode(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        layer: AttentionLayer,
        forward_batch: ForwardBatch,
    ) -> torch.Tensor:
        return self._run(q, k, v, layer, forward_batch)
