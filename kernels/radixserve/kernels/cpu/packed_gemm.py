"""What the two packed bfloat16 GEMM kernels (`amx_gemm`, `rowwise_gemm`) share: a weight
packed once at load that carries its kernel, and one checked call into a library's
`linear(x, m, ldx, wp, n, k, bias, out, ldo, out_f32, threads)` entry."""

from __future__ import annotations

import ctypes
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from radixserve.kernels.cpu.build import check_rc

_P, _I, _C = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
PACK_ARGS: list[Any] = [_P, _I, _I, _I, _P, _C]  # w, n, k, ldw, out, threads
LINEAR_ARGS: list[Any] = [_P, _I, _I, _P, _I, _I, _P, _P, _I, _C, _C]  # as call_linear passes


def bf16_matrix(weight: torch.Tensor) -> bool:
    """A non-empty CPU bfloat16 matrix with unit column stride (what both kernels pack)."""
    return (
        weight.is_cpu
        and weight.dtype == torch.bfloat16
        and weight.dim() == 2
        and weight.stride(1) == 1
        and weight.numel() > 0
    )


@dataclass(frozen=True)
class PackedWeight:
    """A weight [n, k] in a kernel's packed order (`data`, bfloat16), with that kernel."""

    data: torch.Tensor
    n: int
    k: int
    kernel: PackedGemmLibrary

    def linear(
        self, x: torch.Tensor, bias: torch.Tensor | None = None,
        out_dtype: torch.dtype = torch.bfloat16,
    ) -> torch.Tensor:  # fmt: skip
        """x [..., k] → x · Wᵀ (+ bias) through the kernel that packed this weight."""
        return self.kernel.linear(x, self, bias, out_dtype)


@dataclass(frozen=True)
class PackedGemmLibrary:
    """One kernel's loaded library (argtypes bound), multiplying through its
    `radixserve_<ENTRY>_linear` entry; each kernel adds its `pack` (its own layout and sizes)."""

    lib: Any
    ENTRY: ClassVar[str]

    def pack(self, weight: torch.Tensor) -> PackedWeight | None:
        raise NotImplementedError

    def linear(
        self,
        x: torch.Tensor,
        w: PackedWeight,
        bias: torch.Tensor | None = None,
        out_dtype: torch.dtype = torch.bfloat16,
    ) -> torch.Tensor:
        """x [..., k] bfloat16 → x · Wᵀ (+ bias) [..., n] in out_dtype (bfloat16 or float32),
        accumulated in float32 and rounded once."""
        fn = getattr(self.lib, f"radixserve_{self.ENTRY}_linear")
        return call_linear(fn, f"{self.ENTRY} linear", x, w, bias, out_dtype)


def pack_first(
    weight: torch.Tensor, kernels: Iterable[PackedGemmLibrary | None]
) -> tuple[PackedWeight, str] | None:
    """The weight packed by the first of `kernels` that takes it, with that kernel's ENTRY
    name ("amx", "rowwise"); None where none does (a None kernel is skipped)."""
    for kernel in kernels:
        packed = kernel.pack(weight) if kernel is not None else None
        if kernel is not None and packed is not None:
            return packed, kernel.ENTRY
    return None


def call_pack(fn: Any, name: str, weight: torch.Tensor, size: int) -> torch.Tensor:
    """Weight [n, k] (unit column stride) packed by library entry
    `fn(w, n, k, ldw, out, threads)` into `size` bfloat16 values."""
    n, k = weight.shape
    data = torch.empty(size, dtype=torch.bfloat16)
    rc = fn(weight.data_ptr(), n, k, weight.stride(0), data.data_ptr(), torch.get_num_threads())
    check_rc(rc, name)
    return data


def call_linear(  # noqa: PLR0913 - the entry's inputs
    fn: Any, name: str, x: torch.Tensor, w: PackedWeight, bias: torch.Tensor | None,
    out_dtype: torch.dtype,
) -> torch.Tensor:  # fmt: skip
    """x [..., k] CPU bfloat16 → x · Wᵀ (+ bias) [..., n] in out_dtype (bfloat16 or float32),
    through library entry `fn`; bad inputs raise a ValueError naming what is wrong."""
    if x.dtype != torch.bfloat16 or not x.is_cpu or x.shape[-1] != w.k:
        raise ValueError(f"{name} takes CPU bfloat16 [..., {w.k}], got {x.dtype} {x.shape}")
    if out_dtype not in (torch.bfloat16, torch.float32):
        raise ValueError(f"{name} writes bfloat16 or float32, not {out_dtype}")
    if bias is not None and not (
        bias.dtype == torch.bfloat16 and bias.is_contiguous() and bias.numel() == w.n
    ):
        raise ValueError(f"{name} bias must be contiguous bfloat16 [{w.n}]")
    rows = x.reshape(-1, w.k)
    if rows.stride(1) != 1:
        rows = rows.contiguous()
    out = torch.empty((rows.shape[0], w.n), dtype=out_dtype)
    rc = fn(
        rows.data_ptr(), rows.shape[0], rows.stride(0), w.data.data_ptr(), w.n, w.k,
        bias.data_ptr() if bias is not None else None, out.data_ptr(), w.n,
        int(out_dtype == torch.float32), torch.get_num_threads(),
    )  # fmt: skip
    check_rc(rc, name)
    return out.view(*x.shape[:-1], w.n)
