"""bfloat16 projections on AMX tiles (`amx_gemm.cpp`) with tensor arguments.

`load_amx_gemm()` builds (once, cached) and loads the library and returns None where the CPU
has no AMX-BF16 (logged at info), no compiler is, or the build fails (logged as a warning with
the compiler's error); the caller then keeps oneDNN. `build_amx_gemm()` raises instead, naming
which (the tests and the benchmark call it). A weight is packed once (`pack`, at load) and
multiplied by any number of rows (`linear`); the oracle in the tests is `F.linear` in float32
(`tests/kernels/test_cpu_amx_gemm.py`).
"""

from __future__ import annotations

import functools
import logging
import subprocess
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from radixserve.kernels.cpu.build import KERNEL_DIR, bind, open_library
from radixserve.kernels.cpu.packed_gemm import (
    LINEAR_ARGS,
    PACK_ARGS,
    PackedGemmLibrary,
    PackedWeight,
    bf16_matrix,
    call_pack,
)

logger = logging.getLogger(__name__)

SOURCE = KERNEL_DIR / "amx_gemm.cpp"
_SIGNATURES: dict[str, list[Any]] = {
    "radixserve_amx_gemm_available": [],
    "radixserve_amx_pack": PACK_ARGS,
    "radixserve_amx_linear": LINEAR_ARGS,
}


class AmxWeight(PackedWeight):
    """A weight [n, k] in the AMX kernel's tile order (n·k bfloat16 values)."""


def packable(weight: torch.Tensor) -> bool:
    """A CPU bfloat16 matrix whose shape the kernel takes (k % 32 == 0, n % 16 == 0)."""
    return bf16_matrix(weight) and weight.shape[0] % 16 == 0 and weight.shape[1] % 32 == 0


@dataclass(frozen=True)
class AmxGemm(PackedGemmLibrary):
    """The library's functions (argtypes/restype set by `load_amx_gemm`)."""

    ENTRY: ClassVar[str] = "amx"

    def pack(self, weight: torch.Tensor) -> AmxWeight | None:
        """The packed copy of weight [n, k], or None where its shape or dtype is not taken."""
        if not packable(weight):
            return None
        n, k = weight.shape
        data = call_pack(self.lib.radixserve_amx_pack, "amx_pack", weight, n * k)
        return AmxWeight(data, n, k, self)


class AmxUnavailableError(RuntimeError):
    """The library built and loaded, but gives no AMX tiles here."""


def build_amx_gemm() -> AmxGemm:
    """The kernel, built or taken from the cache, loaded. Raises where it can't run: OSError or
    KernelBuildError (no compiler; the compiler's error) from `open_library`, and
    AmxUnavailableError where the library loads but has no tiles (a CPU without AMX-BF16, a
    compiler that did not target it, or Linux refused the tile state)."""
    lib = open_library(SOURCE)
    bind(lib, _SIGNATURES)
    if lib.radixserve_amx_gemm_available() != 1:
        raise AmxUnavailableError(
            "the AMX projection library reports no tiles: no AMX-BF16 on this CPU, a compiler"
            " that did not target it (-march=native), or Linux refused the tile state"
        )
    return AmxGemm(lib)


@functools.cache
def load_amx_gemm() -> AmxGemm | None:
    """`build_amx_gemm` once per process, or None where it raises (the caller keeps oneDNN)."""
    try:
        amx = build_amx_gemm()
    except AmxUnavailableError as exc:
        logger.info("kernels: AMX projections unavailable, using oneDNN: %s", exc)
        return None
    except (OSError, subprocess.SubprocessError) as exc:
        logger.warning("kernels: AMX projections failed to build or load, using oneDNN: %s", exc)
        return None
    logger.info("kernels: AMX projections loaded from %s", amx.lib._name)
    return amx
