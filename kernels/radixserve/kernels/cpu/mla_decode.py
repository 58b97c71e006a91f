"""Absorbed MLA decode over the latent KV pool for the CPU (`mla_decode.cpp`), with tensor
arguments: DeepSeek's one-token rows attend the pool's latent rows in place (one KV head of
width kv_lora_rank + qk_rope_head_dim whose first kv_lora_rank values are the values), each key
row read once per block of query heads. The grouped attention backend calls it for MLA layers;
`load_mla_decode()` builds (once, cached) and loads it, or returns None (a warning carries the
compiler's error) where it can't, and the backend keeps its PyTorch path. The oracle in the
tests is SDPA in float32 on the same rows (`tests/kernels/test_cpu_mla_decode.py`).
"""

from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass
from typing import Any

import torch

from radixserve.kernels.cpu.build import (
    DTYPE_CODES,
    KERNEL_DIR,
    bind,
    check_rc,
    load_library,
    open_library,
)

SOURCE = KERNEL_DIR / "mla_decode.cpp"

_P, _I, _C = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
_SIGNATURES: dict[str, list[Any]] = {
    "radixserve_mla_decode": [
        _C,  # dtype (DTYPE_CODES)
        _P,  # q
        _P,  # kv (the pool's latent rows of this layer)
        _P,  # slots (the slot table)
        _P,  # kv_row
        _P,  # kv_len
        _P,  # out
        _I,  # nrows
        _I,  # heads
        _I,  # d (latent row width)
        _I,  # dv (value width: the first dv columns)
        _I,  # q_stride
        _I,  # kv_stride
        _I,  # slots_stride
        ctypes.c_float,  # scale
        _C,  # num_threads
    ],
}

# The entry's error codes, named as in mla_decode.cpp (MlaDecodeStatus); 0 is success.
MLA_UNSUPPORTED_DTYPE = -1
MLA_BAD_SHAPE = -2


@dataclass(frozen=True)
class MlaDecodeKernel:
    """The library's entry with tensor arguments (bound by `_bound`)."""

    lib: Any

    def __call__(  # noqa: PLR0913 - one argument per input of the kernel
        self,
        q: torch.Tensor,
        kv: torch.Tensor,
        v_dim: int,
        slots: torch.Tensor,
        kv_row: torch.Tensor,
        kv_len: torch.Tensor,
        scale: float,
    ) -> torch.Tensor:
        """q [N, H, d] (rows may be strided), kv [S, 1, d] (the latent pool), slots [B, L]
        int64, kv_row / kv_len [N] int64: row r attends slots[kv_row[r], :kv_len[r]], values
        the rows' first `v_dim` columns → [N, H, v_dim]. The tensors must pass `supports`."""
        n, heads, d = q.shape
        out = torch.empty((n, heads, v_dim), dtype=q.dtype)
        rc = self.lib.radixserve_mla_decode(
            DTYPE_CODES[q.dtype], q.data_ptr(), kv.data_ptr(), slots.data_ptr(),
            kv_row.data_ptr(), kv_len.data_ptr(), out.data_ptr(), n, heads, d, v_dim,
            q.stride(0), kv.stride(0), slots.stride(0), scale, torch.get_num_threads(),
        )  # fmt: skip
        if rc == MLA_BAD_SHAPE:
            raise ValueError(f"MLA decode: v_dim {v_dim} outside [1, {d}] or a row of no keys")
        check_rc(rc, "MLA decode")
        return out

    @staticmethod
    def supports(q: torch.Tensor, kv: torch.Tensor, slots: torch.Tensor) -> bool:
        """CPU tensors of one supported dtype, in the layouts the kernel indexes."""
        return (
            q.device.type == "cpu"
            and q.dtype in DTYPE_CODES
            and kv.dtype == q.dtype
            and q.dim() == 3
            and q.stride(2) == 1
            and q.stride(1) == q.shape[2]
            and kv.dim() == 3
            and kv.shape[1] == 1
            and kv.shape[2] == q.shape[2]
            and kv.stride(2) == 1
            and slots.dtype == torch.int64
            and slots.stride(1) == 1
        )


def _bound(lib: ctypes.CDLL) -> MlaDecodeKernel:
    bind(lib, _SIGNATURES)
    return MlaDecodeKernel(lib)


def build_mla_decode() -> MlaDecodeKernel:
    """The kernel, built or taken from the cache, loaded; raises OSError or KernelBuildError."""
    return _bound(open_library(SOURCE))


@functools.cache
def load_mla_decode() -> MlaDecodeKernel | None:
    """The kernel once per process, or None where it can't be built (logged as a warning)."""
    lib = load_library(SOURCE, "CPU MLA decode kernel")
    return None if lib is None else _bound(lib)
