"""What the host CPU can do, read from /proc/cpuinfo (Linux), used to pick CPU defaults; and the
CPU lists of `--cpu-bind`."""

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


def parse_cpu_list(text: str) -> list[int]:
    """'0-3,8' → [0, 1, 2, 3, 8]; ValueError naming cpu_bind for anything else."""
    cpus: list[int] = []
    for part in text.split(","):
        lo, dash, hi = part.strip().partition("-")
        hi = hi if dash else lo
        if not (lo.isdigit() and hi.isdigit() and int(hi) >= int(lo)):
            raise ValueError(f"cpu_bind: {text!r} is not a CPU list like '0-3,8'")
        cpus += range(int(lo), int(hi) + 1)
    return cpus


def check_cpu_bind(spec: str) -> None:
    """ValueError naming cpu_bind unless `spec` is auto, none or '|'-separated CPU lists."""
    if spec not in ("auto", "none"):
        for group in spec.split("|"):
            parse_cpu_list(group)
