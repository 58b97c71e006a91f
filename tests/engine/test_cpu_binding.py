"""--cpu-bind: which CPUs each scheduler process pins its torch threads to, and that the
pinning really holds for torch's OpenMP threads (read back from the kernel's view of every
thread, /proc/self/task/*/status)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from radixserve.engine.configs.cpu_features import (
    cgroup_cpu_limit,
    omp_num_threads,
    parse_cpu_list,
    usable_cpus,
)
from radixserve.engine.configs.server_args import ServerArgs
from radixserve.engine.scheduler.cpu_binding import cpus_for_process
from tests.child_env import child_env


def test_cpu_lists_parse_and_bad_ones_name_the_flag() -> None:
    assert parse_cpu_list("0-3,8") == [0, 1, 2, 3, 8]
    assert parse_cpu_list("5") == [5]
    for bad in ("", "a-b", "3-1", "0-", "1,,2"):
        with pytest.raises(ValueError, match="cpu_bind"):
            parse_cpu_list(bad)
    with pytest.raises(ValueError, match="cpu_bind"):
        ServerArgs(cpu_bind="0-3|x")
    assert ServerArgs(cpu_bind="0-1|2-3").cpu_bind == "0-1|2-3"


def test_auto_gives_each_process_its_own_share() -> None:
    mask = list(range(8))
    assert cpus_for_process("auto", 0, 1, mask, None) == (mask, "auto")
    assert cpus_for_process("auto", 0, 2, mask, None)[0] == [0, 1, 2, 3]
    assert cpus_for_process("auto", 1, 2, mask, None)[0] == [4, 5, 6, 7]
    assert cpus_for_process("auto", 2, 3, [2, 3, 5, 7, 11, 13], 6.0)[0] == [11, 13]
    # a quota below the mask: a shared node, nothing pinned
    cpus, why = cpus_for_process("auto", 0, 1, mask, 2.0)
    assert cpus is None and "quota" in why
    assert cpus_for_process("none", 0, 1, mask, None)[0] is None
    assert cpus_for_process("auto", 0, 4, [0, 1], None)[0] is None  # oversubscribed
    assert cpus_for_process("0-1|6,7", 1, 2, mask, None)[0] == [6, 7]
    assert cpus_for_process("auto", 1, 2, mask, None, threads=2)[0] == [4, 5]  # OMP_NUM_THREADS
    assert cpus_for_process("0-1", 1, 2, mask, None)[0] is None  # no group for process 1


def test_cgroup_quota_is_read_from_cpu_max_or_the_v1_files(tmp_path: Path) -> None:
    f, v1 = tmp_path / "cpu.max", tmp_path / "v1"
    v1.mkdir()
    f.write_text("max 100000\n")
    assert cgroup_cpu_limit(f, v1) is None
    f.write_text("250000 100000\n")
    assert cgroup_cpu_limit(f, v1) == 2.5
    assert cgroup_cpu_limit(tmp_path / "missing", v1) is None  # no v2 file, no v1 files
    (v1 / "cpu.cfs_period_us").write_text("100000\n")
    (v1 / "cpu.cfs_quota_us").write_text("-1\n")
    assert cgroup_cpu_limit(tmp_path / "missing", v1) is None
    (v1 / "cpu.cfs_quota_us").write_text("400000\n")
    assert cgroup_cpu_limit(tmp_path / "missing", v1) == 4.0


def test_a_quota_cuts_the_threads_to_its_whole_cpus() -> None:
    assert usable_cpus(64, None) == 64
    assert usable_cpus(64, 4.0) == 4
    assert usable_cpus(64, 2.5) == 2  # a thread on half a CPU stalls every parallel region
    assert usable_cpus(2, 8.0) == 2  # the mask still bounds it
    assert usable_cpus(8, 0.5) == 1


def test_each_rank_takes_its_share_of_the_quota(monkeypatch: pytest.MonkeyPatch) -> None:
    import radixserve.engine.configs.server_args as server_args

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(server_args.os, "sched_getaffinity", lambda _pid: set(range(64)))
    monkeypatch.setattr(server_args, "cgroup_cpu_limit", lambda: 8.0)
    assert ServerArgs().cpu_threads_per_rank == 8
    assert ServerArgs(tp_size=2).cpu_threads_per_rank == 4
    monkeypatch.setattr(server_args, "cgroup_cpu_limit", lambda: None)
    assert ServerArgs(tp_size=2).cpu_threads_per_rank == 32


def test_omp_num_threads_is_each_ranks_count(monkeypatch: pytest.MonkeyPatch) -> None:
    """The deployer's OMP_NUM_THREADS (the operator's pod-request sizing) beats the mask and
    the quota, per process as OpenMP reads it."""
    import radixserve.engine.configs.server_args as server_args

    assert [omp_num_threads(v) for v in ("4", " 8,2", None, "", "0", "-2", "x")] == [
        4, 8, None, None, None, None, None,
    ]  # fmt: skip
    monkeypatch.setattr(server_args.os, "sched_getaffinity", lambda _pid: set(range(64)))
    monkeypatch.setattr(server_args, "cgroup_cpu_limit", lambda: None)
    monkeypatch.setenv("OMP_NUM_THREADS", "6")
    assert ServerArgs().cpu_threads_per_rank == 6
    assert ServerArgs(tp_size=2).cpu_threads_per_rank == 6
    assert ServerArgs().chunk_size == 128 * 6
    monkeypatch.setenv("OMP_NUM_THREADS", "0")  # asks for nothing: the mask decides
    assert ServerArgs(tp_size=2).cpu_threads_per_rank == 32


def test_a_lone_rank_keeps_torchs_default_unless_told_fewer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import radixserve.engine.configs.server_args as server_args

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(server_args.os, "sched_getaffinity", lambda _pid: set(range(16)))
    monkeypatch.setattr(server_args, "cgroup_cpu_limit", lambda: None)
    assert ServerArgs().cpu_threads(8) == 8  # 16 logical CPUs, 8 physical cores: torch's count
    assert ServerArgs(tp_size=4).cpu_threads(8) == 4  # ranks share the mask
    monkeypatch.setattr(server_args, "cgroup_cpu_limit", lambda: 3.0)
    assert ServerArgs().cpu_threads(8) == 3  # the quota's whole CPUs
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert ServerArgs().cpu_threads(2) == 2 and ServerArgs(tp_size=2).cpu_threads(2) == 2


RANK_THREADS = """
import sys, torch
from radixserve.engine.configs.server_args import ServerArgs
from radixserve.engine.configs.rank_spec import RankSpec
from radixserve.engine.scheduler.scheduler_process import _set_cpu_threads
_set_cpu_threads(ServerArgs(tp_size=2), RankSpec(tp_rank=1, tp_size=2), 0)
print(torch.get_num_threads())
"""


@pytest.mark.parametrize("omp", [None, "3"])
def test_a_second_rank_sets_the_thread_count_it_was_given(omp: str | None) -> None:
    """In a real process: without OMP_NUM_THREADS, rank 1 of 2 takes half the usable CPUs;
    with it, the count given, though half of this host's CPUs is fewer."""
    env = {k: v for k, v in child_env().items() if k != "OMP_NUM_THREADS"}
    env.update({"OMP_NUM_THREADS": omp} if omp else {})
    run = subprocess.run(
        [sys.executable, "-c", RANK_THREADS], capture_output=True, text=True, timeout=300, env=env
    )
    assert run.returncode == 0, run.stderr[-2000:]
    usable = usable_cpus(len(os.sched_getaffinity(0)), cgroup_cpu_limit())
    assert int(run.stdout) == (int(omp) if omp else max(1, usable // 2))


PROBE = """
import os, sys, torch
from radixserve.kernels.cpu.affinity import bind_omp_threads
assert bind_omp_threads([0])
torch.randn(512, 512) @ torch.randn(512, 512)  # a parallel region after the binding
allowed = set()
for task in os.listdir("/proc/self/task"):
    for line in open(f"/proc/self/task/{task}/status"):
        if line.startswith("Cpus_allowed_list"):
            allowed.add((task, line.split()[1]))
print(torch.get_num_threads(), sorted(a for _, a in allowed), flush=True)
"""


@pytest.mark.skipif(shutil.which("g++") is None, reason="no C++ compiler: threads not pinned")
def test_binding_pins_the_calling_thread_and_sets_the_thread_count() -> None:
    run = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=300, env=child_env()
    )
    assert run.returncode == 0, run.stderr[-2000:]
    threads, allowed = run.stdout.split(" ", 1)
    assert threads == "1"
    assert "'0'" in allowed  # the main (OpenMP master) thread now runs on CPU 0 only
