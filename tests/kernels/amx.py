"""Which AMX tests run is decided by the CPU's flags (the oracle), never by the code under test.

Where /proc/cpuinfo has no `amx_bf16`, the AMX tests skip saying so, and their oneDNN or plain-
kernel halves still run. Where it has, a kernel that fails to build, or loads but reports no
tiles, fails the test with that error (the product's `load_amx_gemm` would hide it as None).
The flags come from the engine's own reader (`cpu_features.cpu_flags`, which picks the CPU
defaults).
"""

from __future__ import annotations

import pytest

from radixserve.engine.configs.cpu_features import cpu_flags
from radixserve.kernels.cpu.amx_gemm import AmxGemm, build_amx_gemm

NO_AMX = "CPU has no AMX-BF16 (amx_bf16 not in /proc/cpuinfo)"


def cpu_has_amx() -> bool:
    """True where the CPU advertises AMX-BF16: there every AMX path must build and run."""
    return "amx_bf16" in cpu_flags()


def skip_without_amx() -> None:
    """Skip the calling test (or fixture) where the CPU has no AMX-BF16."""
    if not cpu_has_amx():
        pytest.skip(NO_AMX)


def amx_gemm_or_none() -> AmxGemm | None:
    """None where the CPU has no AMX-BF16; else the kernel, raising with its build error."""
    return build_amx_gemm() if cpu_has_amx() else None


def amx_gemm_or_skip() -> AmxGemm:
    """The kernel; skips where the CPU has no AMX-BF16, raises with its build error otherwise."""
    skip_without_amx()
    return build_amx_gemm()
