"""The C++ paged attention kernel for the CPU (`kernels/cpu/paged_attention.cpp`): load, call.

The kernel reads every query row's keys and values straight from the KV pool's slots, so a
decode step no longer gathers each request's whole history per layer. It is built and cached
by `radixserve.kernels.cpu.build` (g++ on first use). Without a compiler, or when the build
fails, `load_paged_kernel` returns None and the grouped backend keeps its pure-PyTorch path
(which is also the kernel's test oracle, with the reference backend).

Where the CPU has AMX (and the build could use it), the kernel also takes a prefix that many
decode rows share (a system prompt): `shared` scores all their queries against it at once as
bf16 matrix products on AMX tiles and adds each row's own keys to that partial result
(`kernels/cpu/amx_prefix.h`).
"""

from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass
from typing import Any

import torch

from radixserve.kernels.cpu.build import KERNEL_DIR, load_library
from radixserve.kernels.cpu.dtype_codes import DTYPE_CODES

SOURCE = KERNEL_DIR / "paged_attention.cpp"
_ARGTYPES: list[Any] = [
    ctypes.c_int,
    *[ctypes.c_void_p] * 7,
    *[ctypes.c_int64] * 7,
    ctypes.c_float,
    ctypes.c_int,
]


# then the prefix's slots and length, and the member rows and their count
_SHARED_ARGTYPES: list[Any] = [*_ARGTYPES, *[ctypes.c_void_p, ctypes.c_int64] * 2]
SHARED_UNSUPPORTED = -2  # the shared-prefix entry's "does not apply here" (the caller falls back)
SHARED_BLOCK = 32  # the shared prefix goes on AMX tiles in whole blocks of this many keys
# At most this many prefix keys go on tiles (the rest count as each row's own keys): the call
# packs them into scratch, 2 · Hkv · keys · D bf16 (8 MiB each for K and V at 8 KV heads of 128).
SHARED_MAX_KEYS = 4096


_STORE_ARGTYPES: list[Any] = [
    ctypes.c_int64,
    *[ctypes.c_void_p] * 2,
    *[ctypes.c_int64] * 2,
    *[ctypes.c_void_p] * 2,
    *[ctypes.c_int64] * 2,
    ctypes.c_void_p,
    *[ctypes.c_int64] * 2,
    ctypes.c_int,
]


@dataclass(frozen=True)
class PagedAttentionKernel:
    """`radixserve_paged_attention` of the loaded library, with tensor arguments; `shared_fn`
    its shared-prefix entry where this CPU and build run it (AMX), else None."""

    fn: Any  # the ctypes function (argtypes/restype set by load_paged_kernel)
    shared_fn: Any = None
    store_fn: Any = None

    def store(
        self,
        k: torch.Tensor,
        v: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        loc: torch.Tensor,
    ) -> bool:
        """Write k, v [T, Hkv·D] (rows may be strided) at slots loc [T] of the caches
        [S, Hkv, D]; False, writing nothing, where the tensors do not suit the copy."""
        row = k_cache.shape[1] * k_cache.shape[2]
        if not (
            self.store_fn is not None
            and k.device.type == "cpu"
            and k.dtype == v.dtype == k_cache.dtype == v_cache.dtype
            and k.dim() == 2 == v.dim()
            and k.shape[1] == row == v.shape[1]
            and k.stride(1) == 1 == v.stride(1)
            and k_cache.is_contiguous()
            and v_cache.is_contiguous()
            and loc.dtype == torch.int64
            and loc.is_contiguous()
            and loc.numel() == k.shape[0] == v.shape[0]
        ):
            return False
        rc = self.store_fn(
            k.element_size(), k.data_ptr(), v.data_ptr(), k.stride(0), v.stride(0),
            k_cache.data_ptr(), v_cache.data_ptr(), row, k_cache.shape[0], loc.data_ptr(),
            loc.numel(), row, torch.get_num_threads(),
        )  # fmt: skip
        if rc != 0:
            raise IndexError(f"KV store: a slot of loc is outside the pool's {k_cache.shape[0]}")
        return True

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
        out = torch.empty(q.shape, dtype=q.dtype)
        rc = self.fn(*_common_args(q, k_cache, v_cache, slots, kv_row, kv_len, out, scale))
        if rc != 0:
            raise RuntimeError(f"paged attention kernel failed ({rc})")
        return out

    def shared(  # noqa: PLR0913 - one argument per input of the kernel
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        slots: torch.Tensor,
        kv_row: torch.Tensor,
        kv_len: torch.Tensor,
        scale: float,
        prefix_slots: torch.Tensor,
        members: torch.Tensor,
    ) -> torch.Tensor | None:
        """As `__call__`, where the rows `members` ([n] int64) all start with the slots
        `prefix_slots` ([P] int64, P a multiple of SHARED_BLOCK): that part goes on AMX tiles
        for all of them at once. None where the path does not apply (the caller falls back)."""
        if self.shared_fn is None:
            return None
        out = torch.empty(q.shape, dtype=q.dtype)
        rc = self.shared_fn(
            *_common_args(q, k_cache, v_cache, slots, kv_row, kv_len, out, scale),
            prefix_slots.data_ptr(),
            prefix_slots.numel(),
            members.data_ptr(),
            members.numel(),
        )
        if rc == SHARED_UNSUPPORTED:
            return None
        if rc != 0:
            raise RuntimeError(f"paged attention kernel (shared prefix) failed ({rc})")
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


def _common_args(  # noqa: PLR0913 - one argument per input of the kernel
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slots: torch.Tensor,
    kv_row: torch.Tensor,
    kv_len: torch.Tensor,
    out: torch.Tensor,
    scale: float,
) -> tuple[Any, ...]:
    n, hq, d = q.shape
    return (
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


@functools.cache
def load_paged_kernel() -> PagedAttentionKernel | None:
    """The kernel, built or taken from the cache once per process; None where it can't be."""
    lib = load_library(SOURCE, "CPU paged attention kernel")
    if lib is None:
        return None
    fn = lib.radixserve_paged_attention
    fn.restype = ctypes.c_int
    fn.argtypes = _ARGTYPES
    shared = None
    if lib.radixserve_paged_attention_has_shared() == 1:
        shared = lib.radixserve_paged_attention_shared
        shared.restype = ctypes.c_int
        shared.argtypes = _SHARED_ARGTYPES
    store = lib.radixserve_store_kv
    store.restype = ctypes.c_int
    store.argtypes = _STORE_ARGTYPES
    return PagedAttentionKernel(fn, shared, store)
