"""Which CPUs a scheduler process's compute threads are pinned to (`--cpu-bind`).

- `auto`: on a CPU device, scheduler process i of R takes its share of the CPUs the
  process may run on (the sorted affinity mask cut into R consecutive parts of
  `cpu_threads_per_rank`), one torch thread pinned per CPU, as vLLM's CPU backend binds its
  OpenMP threads: a thread that stays on its core keeps its caches and never waits for a
  migration at the next barrier. Not where a cgroup CPU quota gives the process fewer CPUs
  than its mask (a shared node: replicas pinned there would pile onto the same cores).
- `none` (default): the OS places the threads; also what a process with the overlap loop gets (its
  forward thread would inherit the main thread's one pinned CPU).
- explicit groups, `0-3|4-7`: process i takes the i-th `|` group (comma lists and ranges).

Threads the main thread starts after the binding inherit its one CPU (ZMQ's I/O thread:
light). The HTTP/tokenizer and detokenizer processes stay unpinned: under (b) they used ~0.3 CPU
seconds per 5-second pass together (docs/benchmarks.md), too little to keep a core for.
"""

from __future__ import annotations

import logging
import os

import torch

from radixserve.engine.configs.cpu_features import cgroup_cpu_limit, parse_cpu_list

logger = logging.getLogger(__name__)


def cpus_for_process(
    spec: str, index: int, count: int, mask: list[int], limit: float | None, threads: int = 0
) -> tuple[list[int] | None, str]:
    """The CPUs process `index` of `count` pins its threads to, or None, and why. Under `auto`
    a process given fewer `threads` than its share (`OMP_NUM_THREADS`) takes the first ones."""
    if spec == "none":
        return None, "cpu_bind=none"
    if spec != "auto":
        groups = spec.split("|")
        if index >= len(groups):
            return None, f"cpu_bind has {len(groups)} groups for {count} processes"
        return parse_cpu_list(groups[index]), "cpu_bind groups"
    if count > len(mask):
        return None, f"more processes ({count}) than CPUs ({len(mask)})"
    if limit is not None and limit < len(mask):
        return None, f"a cgroup CPU quota of {limit:g} CPUs under a mask of {len(mask)}"
    share = len(mask) // count
    return mask[index * share : index * share + min(share, threads or share)], "auto"


def bind_process_threads(spec: str, index: int, count: int, threads: int) -> list[int] | None:
    """Pin this process's torch threads per `spec` (see the module doc); the CPUs, or None
    where they were left to the OS (logged with the reason)."""
    from radixserve.kernels.cpu.affinity import bind_omp_threads

    mask = sorted(os.sched_getaffinity(0))
    cpus, why = cpus_for_process(spec, index, count, mask, cgroup_cpu_limit(), threads)
    if cpus is None:
        logger.info("%d cpu threads, not pinned: %s", torch.get_num_threads(), why)
        return None
    if not bind_omp_threads(cpus):
        logger.warning(
            "%d cpu threads, not pinned: binding to %s failed (%s)",
            torch.get_num_threads(),
            cpus,
            why,
        )
        return None
    logger.info("%d cpu threads pinned to %s (%s)", len(cpus), cpus, why)
    return cpus
