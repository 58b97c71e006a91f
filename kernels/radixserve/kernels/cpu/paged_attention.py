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

`extend` is the long-prompt path: the multi-token extends of a batch (a prefill, a chunk over
the earlier chunks, an extend over a cached prefix), tiled flash-style with an online softmax
(`flash_extend.h`): 16 query rows × the G query heads of a KV head against tiles of keys read
from the pool in place, on VDPBF16PS for bf16 where the CPU has AVX512-BF16, in float32
otherwise; no L×L scores. Where the build has no AVX-512 (`has_extend` False) or the head dim
is not one it compiles (`EXTEND_HEAD_DIMS`) it returns None and the caller keeps SDPA.
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
    NATIVE,
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
# radixserve_extend_attention's
_EXTEND_ARGS: list[Any] = [
    _C,  # dtype
    _P,  # q
    _P,  # k
    _P,  # v
    _P,  # slots
    _P,  # kv_row (per request)
    _P,  # q_start
    _P,  # prefix
    _P,  # extend
    _I,  # nreq
    _P,  # out
    _I,  # hq
    _I,  # hkv
    _I,  # d
    _I,  # q_stride
    _I,  # kv_stride
    _I,  # slots_stride
    ctypes.c_float,  # scale
    _C,  # num_threads
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
    "radixserve_extend_attention": _EXTEND_ARGS,
    "radixserve_extend_attention_available": [],
    "radixserve_store_kv": _STORE_ARGS,
}

# The entries' error codes, named as in paged_attention.cpp (PagedAttentionStatus); 0 is
# success. Each entry has its own: -1 means one thing to the attention entry, another to store.
PAGED_UNSUPPORTED_DTYPE = -1  # radixserve_paged_attention: dtype not in DTYPE_CODES
SHARED_UNSUPPORTED = -2  # radixserve_paged_attention_shared: does not apply (caller falls back)
SHARED_PREFIX_MISMATCH = -3  # .._shared: a member's keys do not start with the prefix
STORE_SLOT_OUT_OF_RANGE = -1  # radixserve_store_kv: a slot of loc outside the pool
EXTEND_UNSUPPORTED = -4  # radixserve_extend_attention: does not apply (caller keeps SDPA)
EXTEND_HEAD_DIMS = (16, 32, 64, 128)  # the head dims the tiled extend compiles

SHARED_BLOCK = 32  # the shared prefix goes on AMX tiles in whole blocks of this many keys
# (kPrefixBlock in amx_prefix.h). At most SHARED_MAX_KEYS prefix keys go on tiles (the rest
# count as each row's own keys): the call packs them into scratch, 2 · Hkv · keys · D bf16
# (8 MiB each for K and V at 8 KV heads of 128).
SHARED_MAX_KEYS = 4096


@dataclass(frozen=True)
class ExtendRequests:
    """The multi-token extends of a batch for `PagedAttentionKernel.extend`, one int64 entry
    per request: its query (and output) rows are q_start .. q_start + extend - 1, its keys
    the slots slots[kv_row, : prefix + extend], row j seeing the first prefix + j + 1."""

    kv_row: torch.Tensor
    q_start: torch.Tensor
    prefix: torch.Tensor
    extend: torch.Tensor

    @staticmethod
    def of(
        kv_row: list[int], q_start: list[int], prefix: list[int], extend: list[int]
    ) -> ExtendRequests:
        def t(values: list[int]) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.int64)

        return ExtendRequests(t(kv_row), t(q_start), t(prefix), t(extend))


@dataclass(frozen=True)
class PagedAttentionKernel:
    """The library's entries with tensor arguments (argtypes/restype bound by `_bound`);
    `has_shared`: its shared-prefix entry runs on this CPU and build (AMX tiles);
    `has_extend`: its tiled extend does (an AVX-512 build)."""

    lib: Any
    has_shared: bool
    has_extend: bool = False

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

    def extend(  # noqa: PLR0913 - one argument per input of the kernel
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        slots: torch.Tensor,
        reqs: ExtendRequests,
        scale: float,
        out: torch.Tensor,
    ) -> bool:
        """Causal attention of the extends `reqs` (q [N, Hq, D], rows may be strided) over
        their slot rows of `slots` [B, L], written into their rows of `out` ([N, Hq, D]
        contiguous, q's dtype); False, writing nothing, where the tiled path does not apply
        (the caller attends them another way)."""
        if not (
            self.has_extend
            and q.shape[2] in EXTEND_HEAD_DIMS
            and self.supports(q, k_cache, slots)
            and out.dtype == q.dtype
            and out.shape == q.shape
            and out.is_contiguous()
        ):
            return False
        n, hq, d = q.shape
        rc = self.lib.radixserve_extend_attention(
            DTYPE_CODES[q.dtype], q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(),
            slots.data_ptr(), reqs.kv_row.data_ptr(), reqs.q_start.data_ptr(),
            reqs.prefix.data_ptr(), reqs.extend.data_ptr(), reqs.kv_row.numel(),
            out.data_ptr(), hq, k_cache.shape[1], d, q.stride(0), k_cache.stride(0),
            slots.stride(0), scale, torch.get_num_threads(),
        )  # fmt: skip
        if rc == EXTEND_UNSUPPORTED:
            return False
        check_rc(rc, "extend attention")
        return True

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
    return PagedAttentionKernel(
        lib,
        lib.radixserve_paged_attention_has_shared() == 1,
        lib.radixserve_extend_attention_available() == 1,
    )


def build_paged_attention(arch: tuple[str, ...] = NATIVE) -> PagedAttentionKernel:
    """The kernel for `arch` (this CPU's by default), built or taken from the cache, loaded;
    raises OSError or KernelBuildError (no compiler, or the compiler's error)."""
    return _bound(open_library(SOURCE, arch))


@functools.cache
def load_paged_attention() -> PagedAttentionKernel | None:
    """The kernel once per process, or None where it can't be built (logged as a warning)."""
    lib = load_library(SOURCE, "CPU paged attention kernel")
    return None if lib is None else _bound(lib)
