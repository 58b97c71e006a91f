"""What the host CPU can do, read from /proc/cpuinfo (Linux); used to pick CPU defaults."""

from __future__ import annotations

BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})


def cpu_flags(path: str = "/proc/cpuinfo") -> frozenset[str]:
    """The first processor's feature flags; empty where the file is missing (not Linux)."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def cpu_has_bf16(path: str = "/proc/cpuinfo") -> bool:
    """True where bf16 matmuls run natively (AVX-512 BF16 or AMX): there bf16 is the default."""
    return bool(cpu_flags(path) & BF16_FLAGS)
