"""Compile every kernel, as its launcher configures it on a GPU, for sm_90 without a GPU.

The interpreter runs kernels through numpy and accepts code the compiler rejects (loop-carried
type changes, bad dot shapes, dtype mismatches). This module records each launch of the real
launchers (CPU tensors stand in for CUDA ones; `is_interpreted` is patched to report a GPU)
and compiles it through Triton's NVIDIA backend down to a cubin. Run in a fresh process
without TRITON_INTERPRET (test_compile.py does): `python -m tests.kernels.sm90_compile`.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from radixserve.kernels import (
    activation,
    decode_attention,
    extend_attention,
    kv_index,
    kv_store,
    moe,
    norm,
    rotary,
)
from radixserve.kernels.layout import PagedKv, RaggedKv, TopKOutput

TYPES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16",
         torch.int32: "i32", torch.int64: "i64"}  # fmt: skip
MODULES = (activation, decode_attention, extend_attention, kv_index, kv_store, moe, norm, rotary)


@dataclass
class Recorder:
    """Stands in for a JITFunction: records each launch's signature and constexprs."""

    kernel: Any
    launches: dict[tuple[Any, ...], tuple[dict[str, str], dict[tuple[int, ...], Any]]] = field(
        default_factory=dict
    )

    def __getitem__(self, grid: Any) -> Callable[..., None]:
        def launch(*args: Any, **kwargs: Any) -> None:
            names = self.kernel.arg_names
            values = dict(zip(names, args, strict=False)) | kwargs
            sig: dict[str, str] = {}
            consts: dict[tuple[int, ...], Any] = {}
            for i, param in enumerate(self.kernel.params):
                value = values[names[i]]
                if param.is_constexpr:
                    sig[names[i]], consts[(i,)] = "constexpr", value
                elif isinstance(value, torch.Tensor):
                    sig[names[i]] = "*" + TYPES[value.dtype]
                else:
                    sig[names[i]] = "fp32" if isinstance(value, float) else "i32"
            key = (tuple(sig.items()), tuple(sorted(consts.items())))
            self.launches[key] = (sig, consts)

        return launch


def _install() -> list[Recorder]:
    recorders = []
    for module in MODULES:
        module.is_interpreted = lambda t: False  # type: ignore[attr-defined]
        for name, obj in list(vars(module).items()):
            if isinstance(obj, triton.runtime.jit.JITFunction) and name.endswith("_kernel"):
                recorder = Recorder(obj)
                setattr(module, name, recorder)
                recorders.append(recorder)
    return recorders


def _launch_everything(dtype: torch.dtype) -> None:
    """One launch of each launcher at Llama-3-8B / Qwen-MoE-like shapes in `dtype`."""
    t, hq, hkv, d, slots = 8, 32, 8, 128, 64
    pool = (torch.empty(slots, hkv, d, dtype=dtype), torch.empty(slots, hkv, d, dtype=dtype))
    indptr = torch.tensor([0, 8, 16], dtype=torch.int32)
    kv = PagedKv(*pool, indptr, torch.arange(16, dtype=torch.int32))
    q = torch.empty(2, hq, d, dtype=dtype)
    decode_attention.decode_attention(q, kv, 0.1)
    odd = (torch.empty(slots, 4, 64, dtype=dtype), torch.empty(slots, 4, 64, dtype=dtype))
    odd_kv = PagedKv(*odd, indptr, kv.kv_indices)  # GQA group 7, head_dim 64, soft-cap
    decode_attention.decode_attention(
        torch.empty(2, 28, 64, dtype=dtype), odd_kv, 0.1, logit_cap=30.0
    )
    new = RaggedKv(torch.empty(t, hkv, d, dtype=dtype), torch.empty(t, hkv, d, dtype=dtype),
                   torch.tensor([0, 3, 8], dtype=torch.int32), 5)  # fmt: skip
    extend_attention.extend_attention(torch.empty(t, hq, d, dtype=dtype), new, kv, 0.1)
    extend_attention.extend_attention(
        torch.empty(t, hq, d, dtype=dtype), new, kv, 0.1, logit_cap=5.0
    )
    kv_store.store_kv(*pool, torch.arange(t), new.k, new.v)
    req_to_token = torch.zeros(4, 32, dtype=torch.int32)
    kv_index.fill_kv_indices(req_to_token, torch.arange(2), torch.tensor([3, 9]), kv.kv_indices)
    x = torch.empty(t, 4096, dtype=dtype)
    norm.rms_norm(x, torch.empty(4096, dtype=dtype), 1e-6)
    norm.rms_norm(x, torch.empty(4096, dtype=dtype), 1e-6, residual=torch.empty_like(x))
    activation.silu_and_mul(torch.empty(t, 2 * 1408, dtype=dtype))
    for rot in (128, 64):
        cache = torch.empty(1024, rot, dtype=torch.float32)
        rotary.rotary(torch.zeros(t, dtype=torch.int64), q.new_empty(t, hq, d), new.k, cache)
    qkv = torch.empty(t, (hq + 2 * hkv) * d, dtype=dtype)  # the engine's in-place form
    cos = torch.empty(t, 1, d, dtype=dtype)
    rotary.rotary_tables_(qkv[:, : hq * d].view(t, hq, d),
                          qkv[:, hq * d : (hq + hkv) * d].view(t, hkv, d), cos, cos)  # fmt: skip
    logits = torch.empty(t, 60, dtype=dtype)
    moe.topk_softmax(logits, 4, True)
    topk = TopKOutput(torch.rand(t, 4), torch.randint(0, 16, (t, 4), dtype=torch.int32))
    moe.fused_moe(torch.empty(t, 2048, dtype=dtype), torch.empty(16, 2 * 1408, 2048, dtype=dtype),
                  torch.empty(16, 2048, 1408, dtype=dtype), topk)  # fmt: skip
    moe.fused_moe(torch.empty(t, 2048, dtype=dtype), torch.empty(4, 2 * 1408, 2048, dtype=dtype),
                  torch.empty(4, 2048, 1408, dtype=dtype), topk, expert_offset=4,
                  out_fp32=True)  # fmt: skip


def main() -> int:
    recorders = _install()
    # fp16 takes the bf16 code paths but for the roundings (`triton_util.round_to`)
    for dtype in (torch.bfloat16, torch.float32, torch.float16):
        _launch_everything(dtype)
    target = GPUTarget("cuda", 90, 32)
    start, count = time.monotonic(), 0
    for recorder in recorders:
        for sig, consts in recorder.launches.values():
            triton.compile(ASTSource(recorder.kernel, sig, constexprs=consts), target=target)
            count += 1
    print(f"compiled {count} kernel variants for sm_90 in {time.monotonic() - start:.1f} s")
    return 0 if count else 1


if __name__ == "__main__":
    sys.exit(main())
