"""What the host CPU can do, read from /proc/cpuinfo (Linux), used to pick CPU defaults; how
many CPUs this process may use (its affinity mask and its cgroup's quota) or was told to use
(`OMP_NUM_THREADS`); and the CPU lists of `--cpu-bind`."""

from __future__ import annotations

import math
from pathlib import Path

BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})
CGROUP_CPU_MAX = Path("/sys/fs/cgroup/cpu.max")  # cgroup v2: "<quota> <period>" or "max …"
CGROUP_V1_CPU = Path("/sys/fs/cgroup/cpu")  # cgroup v1: cpu.cfs_quota_us (-1: none), _period_us


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


def cgroup_cpu_limit(path: Path = CGROUP_CPU_MAX, v1: Path = CGROUP_V1_CPU) -> float | None:
    """CPUs the cgroup quota allows (quota / period), None without a quota: cgroup v2's
    cpu.max, else v1's cfs files (nodes still on cgroup v1)."""
    try:
        quota, period = path.read_text().split()[:2]
    except (OSError, ValueError):
        try:
            quota = (v1 / "cpu.cfs_quota_us").read_text().strip()
            period = (v1 / "cpu.cfs_period_us").read_text().strip()
        except OSError:
            return None
    if quota in ("max", "-1") or not (quota.isdigit() and period.isdigit()) or int(period) == 0:
        return None
    return int(quota) / int(period)


def omp_num_threads(value: str | None) -> int | None:
    """The thread count an `OMP_NUM_THREADS` value asks for (OpenMP reads the first element of
    a nested list, "8,2"), or None where it is unset or asks for none."""
    first = (value or "").split(",")[0].strip()
    return int(first) if first.isdigit() and int(first) > 0 else None


def usable_cpus(mask_size: int, limit: float | None) -> int:
    """CPUs worth a compute thread: the affinity mask, cut to the whole CPUs of a cgroup quota.
    A container limited to 4 CPUs on a 64-CPU node sees all 64 in its mask; 64 OpenMP threads
    there would be throttled in turn, and each parallel region waits for its slowest thread."""
    if limit is None:
        return max(1, mask_size)
    return max(1, min(mask_size, math.floor(limit)))
