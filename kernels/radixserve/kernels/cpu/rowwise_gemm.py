"""Batch-invariant bfloat16 projections (`rowwise_gemm.cpp`) with tensor arguments.

Each output element is one fixed sequence of float32 operations over K, so a row's result
does not depend on the other rows of the call (oneDNN's and MKL's do: they block by shape).
It runs on any CPU with a compiler (AVX512-BF16, AVX-512 or scalar code, chosen at build),
for `--enable-deterministic-inference` where the AMX kernel does not, and for the LM head's
float32 logits there. `load_rowwise_gemm()` returns None, with a warning carrying the
compiler's error, where it can't be built; `build_rowwise_gemm()` raises instead. The oracle
in the tests is `F.linear` in float32 (`tests/kernels/test_cpu_rowwise_gemm.py`).
"""

from __future__ import annotations

import ctypes
import functools
import logging
import subprocess
from dataclasses import dataclass
from typing import Any

import torch

from radixserve.kernels.cpu.build import KERNEL_DIR, bind, check_rc, open_library
from radixserve.kernels.cpu.packed_gemm import PackedWeight, call_linear

logger = logging.getLogger(__name__)

SOURCE = KERNEL_DIR / "rowwise_gemm.cpp"
_P, _I, _C = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
_SIGNATURES: dict[str, list[Any]] = {
    "radixserve_rowwise_pack": [_P, _I, _I, _I, _P, _C],
    "radixserve_rowwise_linear": [_P, _I, _I, _P, _I, _I, _P, _P, _I, _C, _C],
}
_COLS = 16  # output columns per packed block (kCols in the source)


class RowwiseWeight(PackedWeight):
    """A weight [n, k] in the row-invariant kernel's order: ceil(n/16)·16 × ceil(k/2)·2."""


def packable(weight: torch.Tensor) -> bool:
    """A non-empty CPU bfloat16 matrix with unit column stride (any shape)."""
    return (
        weight.is_cpu
        and weight.dtype == torch.bfloat16
        and weight.dim() == 2
        and weight.stride(1) == 1
        and weight.numel() > 0
    )


@dataclass(frozen=True)
class RowwiseGemm:
    """The library's functions (argtypes/restype set by `build_rowwise_gemm`)."""

    lib: Any

    def pack(self, weight: torch.Tensor) -> RowwiseWeight | None:
        """The packed copy of weight [n, k], or None where its dtype or layout is not taken."""
        if not packable(weight):
            return None
        n, k = weight.shape
        size = -(-n // _COLS) * _COLS * (-(-k // 2) * 2)
        data = torch.empty(size, dtype=torch.bfloat16)
        rc = self.lib.radixserve_rowwise_pack(
            weight.data_ptr(), n, k, weight.stride(0), data.data_ptr(), torch.get_num_threads()
        )
        check_rc(rc, "rowwise_pack")
        return RowwiseWeight(data, n, k, self)

    def linear(
        self,
        x: torch.Tensor,
        w: PackedWeight,
        bias: torch.Tensor | None = None,
        out_dtype: torch.dtype = torch.bfloat16,
    ) -> torch.Tensor:
        """x [..., k] bfloat16 → x · Wᵀ (+ bias) [..., n] in out_dtype (bfloat16 or float32),
        accumulated in float32 in K order and rounded once."""
        fn = self.lib.radixserve_rowwise_linear
        return call_linear(fn, "rowwise linear", x, w, bias, out_dtype)


def build_rowwise_gemm() -> RowwiseGemm:
    """The kernel, built or taken from the cache, loaded; raises OSError or KernelBuildError
    (no compiler, or the compiler's error) from `open_library`."""
    lib = open_library(SOURCE)
    bind(lib, _SIGNATURES)
    return RowwiseGemm(lib)


@functools.cache
def load_rowwise_gemm() -> RowwiseGemm | None:
    """`build_rowwise_gemm` once per process, or None where it raises."""
    try:
        return build_rowwise_gemm()
    except (OSError, subprocess.SubprocessError) as exc:
        logger.warning("kernels: row-invariant projections failed to build or load: %s", exc)
        return None
