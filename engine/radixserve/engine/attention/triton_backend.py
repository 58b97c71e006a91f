"""The Triton attention backend: the kernels of `radixserve.kernels` over the paged KV pool.

Per forward batch, `init_forward_metadata` plans once what every layer reads: the per-token
KV indices (`kv_indptr` / `kv_indices`, built on the device from the batch's `kv_rows` copy of
`req_to_token`), and for extends the new tokens' `qo_indptr`. Each layer then stores its new
K/V with `store_kv` and runs the split-K decode kernel (DECODE) or the extend kernel (EXTEND and
MIXED: the cached prefix through the indices, the new tokens dense and causal). Values may be
narrower than keys: absorbed MLA's one latent KV head (576 wide at DeepSeek's shapes), whose
value is a view of its first kv_lora_rank columns; both kernels take a value width of their own.

CUDA graphs (`cuda_graph_runner.py`): `init_cuda_graph_state` allocates static index buffers
sized for the largest captured batch; `init_forward_metadata_replay` rewrites them in place
before a replay (padding rows read one token at the reserved slot 0), so the captured kernels
read the live batch through fixed addresses.

On a CPU the kernels run under TRITON_INTERPRET=1 (slow; for tests of this bookkeeping). The
kernel modules are imported when the backend is built, not when the registry is, so the
default CPU engine never imports triton.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from radixserve.engine.attention.base import AttentionBackend
from radixserve.engine.attention.spec import AttentionSpec
from radixserve.engine.forward_batch import AttentionLayer, ForwardBatch

if TYPE_CHECKING:
    from radixserve.kernels.layout import KvIndices

# SGLang's default split count on GPUs; fewer on the interpreter, where programs run one by one.
GPU_KV_SPLITS = 8
CPU_KV_SPLITS = 2


@dataclass(frozen=True, slots=True)
class TritonMetadata:
    """What every layer of one forward reads (the kernels' `PagedKv` / `RaggedKv` indices)."""

    kv_indptr: torch.Tensor  # [B + 1] int32: decode over seq_lens, extend over prefix lens
    kv_indices: torch.Tensor  # int32 pool slots, per token
    qo_indptr: torch.Tensor | None  # [B + 1] int32 rows of the new tokens (extend only)
    max_extend_len: int  # longest new-token run (extend only; sizes the grid)


@dataclass(frozen=True, slots=True)
class GraphBuffers:
    """Static buffers a captured decode reads; rewritten in place before each replay."""

    kv_rows: torch.Tensor  # [max_bs, max_context_len] int64 slots (padding rows: slot 0)
    kv_indptr: torch.Tensor  # [max_bs + 1] int32
    kv_indices: torch.Tensor  # [max_bs * max_context_len] int32


def _require_kernels(device: torch.device) -> None:
    """Triton runs on CUDA, or on the CPU only under its interpreter: say which is missing."""
    if device.type == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        raise ValueError(
            "attention_backend=triton on the CPU needs TRITON_INTERPRET=1 in the environment "
            "(the kernels then run interpreted: slow, for tests); use grouped or torch otherwise"
        )


def _indptr(lens: list[int], device: torch.device) -> torch.Tensor:
    """[len(lens) + 1] int32 running sum of host lengths (one small host→device copy)."""
    out = [0]
    for n in lens:
        out.append(out[-1] + n)
    return torch.tensor(out, dtype=torch.int32, device=device)


class TritonAttnBackend(AttentionBackend):
    def __init__(self, spec: AttentionSpec | None = None) -> None:
        device = spec.device if spec is not None else torch.device("cpu")
        _require_kernels(device)
        # Imported here: decorating a kernel reads TRITON_INTERPRET, and the CPU default path
        # must not import triton at all.
        from radixserve.kernels.decode_attention import decode_attention
        from radixserve.kernels.extend_attention import extend_attention
        from radixserve.kernels.kv_index import fill_kv_indices
        from radixserve.kernels.kv_store import store_kv

        self._decode_attention = decode_attention
        self._extend_attention = extend_attention
        self._fill_kv_indices = fill_kv_indices
        self._store_kv = store_kv
        self.spec = spec
        self.num_kv_splits = CPU_KV_SPLITS if device.type == "cpu" else GPU_KV_SPLITS
        self.metadata: TritonMetadata | None = None
        self.graph: GraphBuffers | None = None

    # ---- planning (once per forward) ----

    def _fill(self, rows: torch.Tensor, lens: torch.Tensor, total: int) -> KvIndices:
        """Per-token slots of each row's first `lens[i]` positions (no host sync)."""
        # never empty (an extend with no cached prefix has total 0): no null pointer to launch
        buf = torch.empty(max(total, 1), dtype=torch.int32, device=rows.device)
        ids = torch.arange(rows.shape[0], device=rows.device)
        return self._fill_kv_indices(rows, ids, lens, kv_indices=buf)

    def init_forward_metadata(self, forward_batch: ForwardBatch) -> None:
        fb = forward_batch
        if fb.forward_mode.is_decode():
            idx = self._fill(fb.kv_rows, fb.seq_lens, sum(fb.seq_lens_cpu))
            self.metadata = TritonMetadata(idx.kv_indptr, idx.kv_indices, None, 0)
            return
        device = fb.seq_lens.device
        prefix = torch.tensor(fb.extend_prefix_lens_cpu, dtype=torch.int64, device=device)
        idx = self._fill(fb.kv_rows, prefix, sum(fb.extend_prefix_lens_cpu))
        qo_indptr = _indptr(fb.extend_seq_lens_cpu, device)
        self.metadata = TritonMetadata(
            idx.kv_indptr, idx.kv_indices, qo_indptr, max(fb.extend_seq_lens_cpu, default=0)
        )

    # ---- CUDA graphs ----

    def init_cuda_graph_state(
        self, max_bs: int, max_context_len: int, device: torch.device
    ) -> None:
        self.graph = GraphBuffers(
            kv_rows=torch.zeros(max_bs, max_context_len, dtype=torch.int64, device=device),
            kv_indptr=torch.zeros(max_bs + 1, dtype=torch.int32, device=device),
            kv_indices=torch.zeros(max_bs * max_context_len, dtype=torch.int32, device=device),
        )

    def init_forward_metadata_replay(
        self, forward_batch: ForwardBatch, bs: int, seq_lens: torch.Tensor
    ) -> None:
        """Plan a decode of `forward_batch` padded to `bs` rows into the static buffers.

        seq_lens: the padded [bs] lengths (padding rows 1). Padding rows' kv_rows are zeros, so
        they read one token at the reserved slot 0. Also used (with a zero batch) at capture.
        """
        g = self.graph
        if g is None:
            raise RuntimeError("init_cuda_graph_state was not called")
        real, width = forward_batch.kv_rows.shape
        g.kv_rows[:real, :width].copy_(forward_batch.kv_rows)
        g.kv_rows[real:bs, :1].fill_(0)  # padding rows read one position: slot 0
        idx = self._fill_kv_indices(
            g.kv_rows[:bs], torch.arange(bs, device=seq_lens.device), seq_lens,
            kv_indices=g.kv_indices,
        )  # fmt: skip
        g.kv_indptr[: bs + 1].copy_(idx.kv_indptr)
        self.metadata = TritonMetadata(g.kv_indptr[: bs + 1], g.kv_indices, None, 0)

    # ---- per layer ----

    def _store(
        self, k: torch.Tensor, v: torch.Tensor, layer: AttentionLayer, fb: ForwardBatch
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        k = k.view(-1, layer.num_kv_heads, layer.head_dim)
        v = v.view(-1, layer.num_kv_heads, layer.v_head_dim)  # MLA: the latent's first columns
        k_buf, v_buf = fb.token_to_kv_pool.get_kv_buffer(layer.layer_id)
        self._store_kv(k_buf, v_buf, fb.out_cache_loc, k, v)
        return k, v, k_buf, v_buf

    def _meta(self) -> TritonMetadata:
        if self.metadata is None:
            raise RuntimeError("init_forward_metadata must run before the layers")
        return self.metadata

    def forward_extend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        layer: AttentionLayer,
        forward_batch: ForwardBatch,
    ) -> torch.Tensor:
        from radixserve.kernels.layout import PagedKv, RaggedKv

        meta = self._meta()
        assert meta.qo_indptr is not None, "an extend forward planned as a decode"
        k, v, k_buf, v_buf = self._store(k, v, layer, forward_batch)
        q = q.view(-1, layer.num_heads, layer.head_dim)
        out = self._extend_attention(
            q,
            RaggedKv(k, v, meta.qo_indptr, meta.max_extend_len),
            PagedKv(k_buf, v_buf, meta.kv_indptr, meta.kv_indices),
            layer.scaling,
        )
        return out.view(-1, layer.num_heads * layer.v_head_dim)

    def forward_decode(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        layer: AttentionLayer,
        forward_batch: ForwardBatch,
    ) -> torch.Tensor:
        from radixserve.kernels.layout import PagedKv

        meta = self._meta()
        _k, _v, k_buf, v_buf = self._store(k, v, layer, forward_batch)
        q = q.reshape(-1, layer.num_heads, layer.head_dim)
        out = self._decode_attention(
            q,
            PagedKv(k_buf, v_buf, meta.kv_indptr, meta.kv_indices),
            layer.scaling,
            num_kv_splits=self.num_kv_splits,
        )
        return out.view(-1, layer.num_heads * layer.v_head_dim)
