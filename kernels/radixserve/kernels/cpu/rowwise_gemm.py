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

import functools
import logging
import subprocess
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from radixserve.kernels.cpu.build import KERNEL_DIR, NATIVE, bind, open_library
from radixserve.kernels.cpu.packed_gemm import (
    LINEAR_ARGS,
    PACK_ARGS,
    PackedGemmLibrary,
    PackedWeight,
    bf16_matrix,
    call_pack,
)

logger = logging.getLogger(__name__)

SOURCE = KERNEL_DIR / "rowwise_gemm.cpp"
_SIGNATURES: dict[str, list[Any]] = {
    "radixserve_rowwise_pack": PACK_ARGS,
    "radixserve_rowwise_linear": LINEAR_ARGS,
}
_COLS = 16  # output columns per packed block (kCols in the source)


class RowwiseWeight(PackedWeight):
    """A weight [n, k] in the row-invariant kernel's order: ceil(n/16)·16 × ceil(k/2)·2."""


@dataclass(frozen=True)
class RowwiseGemm(PackedGemmLibrary):
    """The library's functions (argtypes/restype set by `build_rowwise_gemm`)."""

    ENTRY: ClassVar[str] = "rowwise"

    def pack(self, weight: torch.Tensor) -> RowwiseWeight | None:
        """The packed copy of weight [n, k], or None where its dtype or layout is not taken."""
        if not bf16_matrix(weight):  # any shape
            return None
        n, k = weight.shape
        size = -(-n // _COLS) * _COLS * (-(-k // 2) * 2)
        data = call_pack(self.lib.radixserve_rowwise_pack, "rowwise_pack", weight, size)
        return RowwiseWeight(data, n, k, self)


def build_rowwise_gemm(arch: tuple[str, ...] = NATIVE) -> RowwiseGemm:
    """The kernel for `arch` (this CPU's by default), built or taken from the cache, loaded;
    raises OSError or KernelBuildError (no compiler, or the compiler's error)."""
    lib = open_library(SOURCE, arch)
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
