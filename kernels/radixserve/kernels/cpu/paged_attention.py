"""Paged attention over the KV pool for the CPU (`paged_attention.cpp`) with tensor arguments.

The kernel reads every query row's keys and values straight from the pool's slots, so a decode
step does not gather each request's whole history per layer; `store` writes a forward's K/V
rows into the pool. `load_paged_attention()` builds (once, cached) and loads the library, or
returns None (a warning carries the compiler's error) where it can't; the grouped attention
backend then keeps its pure-PyTorch path. `build_paged_attention()` raises instead. The oracle
in the tests is attention computed in float32 by PyTorch on the same K/V
(`tests/kernels/test_cpu_paged_attention.py`).

Where the CPU has AMX (and the build could use it), the kernel also takes a prefix that many
rows share (a system prompt): `shared` scores all their queries against it at once as bf16
matrix products on AMX tiles and adds each row's own keys to that partial result
(`amx_prefix.h`).
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

SOURCE = KERNEL_DIR / "paged_attention.cpp"

_P, _I, _C = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
# radixserve_paged_attention's parameters, in order (`_attention_args` passes them)
_ATTENTION_ARGS: list[Any] = [
    _C,  # dtype (DTYPE_CODES)
    _P,  # q
    _P,  # k (the pool's K of this layer)
    _P,  # v
    _P,  # slots (the slot table)
    _P,  # kv_row
    _P,  # kv_len
    _P,  # out
    _I,  # nrows
    _I,  # hq
    _I,  # hkv
    _I,  # d
    _I,  # q_stride
    _I,  # kv_stride
    _I,  # slots_stride
    ctypes.c_float,  # scale
    _C,  # num_threads
]
# radixserve_paged_attention_shared's: the above, then these
_SHARED_ARGS: list[Any] = [
    *_ATTENTION_ARGS,
    _P,  # prefix_slots
    _I,  # prefix_len
    _P,  # members
    _I,  # n (members)
]
_STORE_ARGS: list[Any] = [
    _I,  # elem_size (bytes)
    _P,  # k
    _P,  # v
    _I,  # k_stride
    _I,  # v_stride
    _P,  # k_cache
    _P,  # v_cache
    _I,  # kv_stride
    _I,  # num_slots
    _P,  # loc
    _I,  # n
    _I,  # row (elements per K/V row)
    _C,  # num_threads
]
_SIGNATURES: dict[str, list[Any]] = {
    "radixserve_paged_attention": _ATTENTION_ARGS,
    "radixserve_paged_attention_shared": _SHARED_ARGS,
    "radixserve_paged_attention_has_shared": [],
    "radixserve_store_kv": _STORE_ARGS,
}

# The entries' error codes, named as in paged_attention.cpp (PagedAttentionStatus); 0 is
# success. Each entry has its own: -1 means one thing to the attention entry, another to store.
PAGED_UNSUPPORTED_DTYPE = -1  # radixserve_paged_attention: dtype not in DTYPE_CODES
SHARED_UNSUPPORTED = -2  # radixserve_paged_attention_shared: does not apply (caller falls back)
SHARED_PREFIX_MISMATCH = -3  # .._shared: a member's keys do not start with the prefix
STORE_SLOT_OUT_OF_RANGE = -1  # radixserve_store_kv: a slot of loc outside the pool

SHARED_BLOCK = 32  # the shared prefix goes on AMX tiles in whole blocks of this many keys
# (kPrefixBlock in amx_prefix.h). At most SHARED_MAX_KEYS prefix keys go on tiles (the rest
# count as each row's own keys): the call packs them into scratch, 2 · Hkv · keys · D bf16
# (8 MiB each for K and V at 8 KV heads of 128).
SHARED_MAX_KEYS = 4096


@dataclass(frozen=True)
class PagedAttentionKernel:
    """The library's entries with tensor arguments (argtypes/restype bound by `_bound`);
    `has_shared`: its shared-prefix entry runs on this CPU and build (AMX tiles)."""

    lib: Any
    has_shared: bool

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
            k.device.type == "cpu"
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
        rc = self.lib.radixserve_store_kv(
            k.element_size(), k.data_ptr(), v.data_ptr(), k.stride(0), v.stride(0),
            k_cache.data_ptr(), v_cache.data_ptr(), row, k_cache.shape[0], loc.data_ptr(),
            loc.numel(), row, torch.get_num_threads(),
        )  # fmt: skip
        if rc == STORE_SLOT_OUT_OF_RANGE:
            raise IndexError(f"KV store: a slot of loc is outside the pool's {k_cache.shape[0]}")
        check_rc(rc, "store_kv")
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
        kv_row/kv_len [N] int64: row r attends slots[kv_row[r], :kv_len[r]] → [N, Hq, D].
        The tensors must pass `supports`."""
        out = torch.empty(q.shape, dtype=q.dtype)
        args = _attention_args(q, k_cache, v_cache, slots, kv_row, kv_len, out, scale)
        check_rc(self.lib.radixserve_paged_attention(*args), "paged attention")
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
        if not self.has_shared:
            return None
        out = torch.empty(q.shape, dtype=q.dtype)
        rc = self.lib.radixserve_paged_attention_shared(
            *_attention_args(q, k_cache, v_cache, slots, kv_row, kv_len, out, scale),
            prefix_slots.data_ptr(),
            prefix_slots.numel(),
            members.data_ptr(),
            members.numel(),
        )
        if rc == SHARED_UNSUPPORTED:
            return None
        check_rc(rc, "paged attention (shared prefix)")
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


def _attention_args(  # noqa: PLR0913 - one argument per input of the kernel
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slots: torch.Tensor,
    kv_row: torch.Tensor,
    kv_len: torch.Tensor,
    out: torch.Tensor,
    scale: float,
) -> tuple[Any, ...]:
    """radixserve_paged_attention's arguments (`_ATTENTION_ARGS`) for these tensors."""
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


def _bound(lib: ctypes.CDLL) -> PagedAttentionKernel:
    bind(lib, _SIGNATURES)
    return PagedAttentionKernel(lib, lib.radixserve_paged_attention_has_shared() == 1)


def build_paged_attention() -> PagedAttentionKernel:
    """The kernel, built or taken from the cache, loaded; raises OSError or KernelBuildError
    (no compiler, or the compiler's error)."""
    return _bound(open_library(SOURCE))


@functools.cache
def load_paged_attention() -> PagedAttentionKernel | None:
    """The kernel once per process, or None where it can't be built (logged as a warning)."""
    lib = load_library(SOURCE, "CPU paged attention kernel")
    return None if lib is None else _bound(lib)
