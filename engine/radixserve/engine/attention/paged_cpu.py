"""The C++ paged attention kernel for the CPU (`kernels/cpu/paged_attention.cpp`): load, call.

The kernel reads every query row's keys and values straight from the KV pool's slots, so a
decode step no longer gathers each request's whole history per layer. It is built and cached
by `radixserve.kernels.cpu.build` (g++ on first use). Without a compiler, or when the build
fails, `load_paged_kernel` returns None and the grouped backend keeps its pure-PyTorch path
(which is also the kernel's test oracle, with the reference backend).
"""

from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass
from typing import Any

import torch

from radixserve.kernels.cpu.build import KERNEL_DIR, load_library

SOURCE = KERNEL_DIR / "paged_attention.cpp"
DTYPE_CODES = {torch.float32: 0, torch.bfloat16: 1}
_ARGTYPES: list[Any] = [
    ctypes.c_int,
    *[ctypes.c_void_p] * 7,
    *[ctypes.c_int64] * 7,
    ctypes.c_float,
    ctypes.c_int,
]


@dataclass(frozen=True)
class PagedAttentionKernel:
    """`radixserve_paged_attention` of the loaded library, with tensor arguments."""

    fn: Any  # the ctypes function (argtypes/restype set by load_paged_kernel)

    def __call__(  # noqa: PLR0913 - one argument per input of the kernel
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        slots: torch.Tensor,
        kv_row: torch.Tensor,
        kv_len: torch.Tensor,
        scale: float,
    ) -> torch.Tensor:
        """q [N, Hq, D] (rows may be strided), k/v_cache [S, Hkv, D], slots [B, L] int64,
        kv_row/kv_len [N] int64: row r attends slots[kv_row[r], :kv_len[r]] → [N, Hq, D]."""
        n, hq, d = q.shape
        out = torch.empty((n, hq, d), dtype=q.dtype)
        rc = self.fn(
            DTYPE_CODES[q.dtype],
            q.data_ptr(),
            k_cache.data_ptr(),
            v_cache.data_ptr(),
            slots.data_ptr(),
            kv_row.data_ptr(),
            kv_len.data_ptr(),
            out.data_ptr(),
            n,
            hq,
            k_cache.shape[1],
            d,
            q.stride(0),
            k_cache.stride(0),
            slots.stride(0),
            scale,
            torch.get_num_threads(),
        )
        if rc != 0:
            raise RuntimeError(f"paged attention kernel failed ({rc})")
        return out

    @staticmethod
    def supports(q: torch.Tensor, k_cache: torch.Tensor, slots: torch.Tensor) -> bool:
        """CPU tensors of one supported dtype, in the layouts the kernel indexes."""
        return (
            q.device.type == "cpu"
            and q.dtype in DTYPE_CODES
            and k_cache.dtype == q.dtype
            and q.stride(2) == 1
            and q.stride(1) == q.shape[2]
            and k_cache.stride(2) == 1
            and k_cache.stride(1) == k_cache.shape[2]
            and slots.dtype == torch.int64
            and slots.stride(1) == 1
        )


@functools.cache
def load_paged_kernel() -> PagedAttentionKernel | None:
    """The kernel, built or taken from the cache once per process; None where it can't be."""
    lib = load_library(SOURCE, "CPU paged attention kernel")
    if lib is None:
        return None
    fn = lib.radixserve_paged_attention
    fn.restype = ctypes.c_int
    fn.argtypes = _ARGTYPES
    return PagedAttentionKernel(fn)
