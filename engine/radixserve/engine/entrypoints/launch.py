"""Starts a replica's child processes (one scheduler per rank, the detokenizer), waits for every
rank's start-up handshake, watches them, and shuts them down in order. Without DP attention
each of the dp_size scheduling groups has its own torch.distributed rendezvous of tp_size
ranks; with it one rendezvous holds all tp_size ranks. Each DP rank has its own scheduler
input (`PortArgs.scheduler_input_for`).

Children are spawned (not forked: torch and ZMQ state must not be shared), ignore SIGINT
(the parent owns Ctrl-C) and are SIGKILLed by the kernel if the parent dies. This module does
not import torch (the layout checks that need it import it themselves): `serve` starts the
children (`start_subprocesses`) before it imports the HTTP side, so the children's start-up and
the parent's imports overlap, then waits for them (`wait_until_ready`).
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import signal
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from multiprocessing.process import BaseProcess
from typing import Any

from radixserve.engine.configs.model_checks import (
    check_devices,
    check_ep_layout,
    check_mlp_layout,
    check_tp_layout,
)
from radixserve.engine.configs.rank_spec import RankSpec
from radixserve.engine.configs.server_args import ServerArgs
from radixserve.engine.configs.speculative_args import DRAFT_MODEL_ALGORITHMS, check_draft_model
from radixserve.engine.entrypoints.process_utils import configure_child_logging, die_with_parent
from radixserve.engine.ipc.channels import PortArgs

logger = logging.getLogger(__name__)

STARTUP_TIMEOUT_S = 600.0
# libgomp's threads spin at a barrier GOMP_SPINCOUNT times before they sleep: 300,000 (about
# 3 ms) unless OMP_WAIT_POLICY says otherwise. When another process takes one of their cores,
# a thread spinning for the partner that lost its core burns the core that partner needs, and
# a step takes many times longer (docs/benchmarks.md, "Cores shared with another process").
# A spin 30 times shorter loses nothing measurable on idle cores.
CPU_CHILD_ENV = {"GOMP_SPINCOUNT": "10000"}
OMP_WAIT_VARS = ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")  # the user's choice wins


@contextmanager
def _child_environment(args: ServerArgs) -> Iterator[None]:
    """Our defaults for the spawned children's environment, where the user set none of the
    wait variables; the parent's own environment is restored once they started (a spawned
    child copies os.environ when it starts)."""
    extra: dict[str, str] = {}
    if args.device == "cpu" and not any(v in os.environ for v in OMP_WAIT_VARS):
        extra = CPU_CHILD_ENV
    os.environ.update(extra)
    try:
        yield
    finally:
        for name in extra:
            os.environ.pop(name, None)


def _scheduler_main(
    args: ServerArgs, ports: PortArgs, writer: Any, dp_rank: int, rank: RankSpec, parent: int
) -> None:
    die_with_parent(parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    configure_child_logging(
        args.log_level, f"scheduler-{dp_rank}-tp{rank.tp_rank}", args.log_format
    )
    from radixserve.engine.scheduler.scheduler_process import run_scheduler_process

    run_scheduler_process(args, ports, writer, dp_rank, rank)


def _detokenizer_main(args: ServerArgs, ports: PortArgs, parent: int) -> None:
    die_with_parent(parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    configure_child_logging(args.log_level, "detokenizer", args.log_format)
    from radixserve.engine.detokenizer.detokenizer_manager import run_detokenizer_process

    run_detokenizer_process(args.model_path, ports, args.revision)


@dataclass(slots=True)
class ChildProcesses:
    ports: PortArgs
    scheduler_info: dict[str, Any]
    procs: list[BaseProcess] = field(default_factory=list)
    rank_infos: list[dict[str, Any]] = field(default_factory=list)  # TP rank 0 of each DP rank
    crashed: bool = False  # the server is stopping because something died (a child, the loop)

    def dead(self) -> list[BaseProcess]:
        return [p for p in self.procs if not p.is_alive()]

    def shutdown(self, timeout_s: float = 5.0) -> None:
        """Scheduler first (stops producing), then the detokenizer; kill stragglers."""
        for p in self.procs:
            if p.is_alive():
                p.terminate()
        deadline = time.monotonic() + timeout_s
        for p in self.procs:
            p.join(max(deadline - time.monotonic(), 0.1))
            if p.is_alive():
                p.kill()
                p.join(1)


def check_draft_layout(args: ServerArgs) -> None:
    """Refuse, before any process starts, a draft model (STANDALONE) or head (EAGLE) that
    cannot draft for the model (ValueError naming --speculative-draft-model-path)."""
    draft_path = args.speculative_draft_model_path
    if args.speculative_algorithm not in DRAFT_MODEL_ALGORITHMS or draft_path is None:
        return
    from radixserve.engine.model_loader import load_model_files, resolve_model  # torch

    target = load_model_files(resolve_model(args.model_path, args.revision), args.resolved_dtype)
    try:
        draft = load_model_files(resolve_model(draft_path), args.resolved_dtype)
    except (OSError, ValueError) as exc:
        why = f"cannot load {draft_path!r}: {exc}"
        raise ValueError(f"speculative_draft_model_path: {why}") from exc
    check_draft_model(target.config, draft.config, eagle=args.speculative_algorithm == "EAGLE")


def check_parallel_layout(args: ServerArgs) -> None:
    """Refuse, before any process starts, a TP / EP size the model or the machine cannot run
    (ValueError naming the flag)."""
    if args.num_ranks == 1:
        return
    import torch  # the engine extra; only needed to count devices

    check_devices(args, torch.cuda.device_count() if args.device.startswith("cuda") else 0)
    from radixserve.engine.model_loader import load_model_files, resolve_model

    source = resolve_model(args.model_path, args.revision)
    config = load_model_files(source, args.resolved_dtype).config
    check_tp_layout(config, args.attn_tp_size, args.enable_dp_attention)
    check_mlp_layout(config, args.tp_size)  # under DP attention wider than attention's split
    check_ep_layout(config, args.ep_size, args.ep_num_redundant_experts)
    if config.moe is not None and args.ep_size > 1:  # a bad placement file fails here, named
        from radixserve.engine.layers.expert_location import expert_location_for

        expert_location_for(args, config, args.ep_size)


def free_tcp_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _rank_layout(args: ServerArgs) -> list[tuple[int, RankSpec]]:
    """(dp_rank, RankSpec) of every scheduler process, DP rank by DP rank. Without DP
    attention each DP rank is its own torch.distributed world of tp_size ranks; with it there
    is one world of tp_size ranks, tp_size / dp_size consecutive ones per DP rank."""

    def spec(rank: int, port: int, attn_dp_size: int = 1) -> RankSpec:
        return RankSpec(
            rank,
            args.tp_size,
            port,
            ep_size=args.ep_size,
            moe_a2a_backend=args.moe_a2a_backend,
            attn_dp_size=attn_dp_size,
        )

    if args.enable_dp_attention:
        port = free_tcp_port("127.0.0.1")
        specs = [spec(r, port, args.dp_size) for r in range(args.tp_size)]
        return [(s.dp_rank, s) for s in specs]
    out = []
    for dp_rank in range(args.dp_size):
        port = free_tcp_port("127.0.0.1") if args.tp_size > 1 else 0
        out += [(dp_rank, spec(r, port)) for r in range(args.tp_size)]
    return out


@dataclass(slots=True)
class StartedChildren:
    """Children started, not yet known to be ready: each rank's start-up pipe beside them."""

    children: ChildProcesses
    readers: list[Any]
    attn_tp_size: int


def start_subprocesses(args: ServerArgs) -> StartedChildren:
    """Check the layout, then start tp_size schedulers for each of the dp_size DP ranks + the
    detokenizer, without waiting for them."""
    check_parallel_layout(args)
    check_draft_layout(args)
    ctx = mp.get_context("spawn")
    ports = PortArgs.create()
    readers, procs = [], []
    for dp_rank, rank in _rank_layout(args):
        reader, writer = ctx.Pipe(duplex=False)
        readers.append(reader)
        procs.append(
            ctx.Process(
                target=_scheduler_main,
                args=(args, ports, writer, dp_rank, rank, os.getpid()),
                name=f"radixserve-scheduler-{dp_rank}-tp{rank.tp_rank}",
                daemon=True,
            )
        )
    detok = ctx.Process(
        target=_detokenizer_main,
        args=(args, ports, os.getpid()),
        name="radixserve-detokenizer",
        daemon=True,
    )
    children = ChildProcesses(ports, {}, [*procs, detok])
    with _child_environment(args):
        for p in children.procs:
            p.start()
    return StartedChildren(children, readers, args.attn_tp_size)


def wait_until_ready(started: StartedChildren) -> ChildProcesses:
    """Every rank's start-up handshake; the children, shut down if one fails."""
    children = started.children
    infos = [_wait_ready(children, reader) for reader in started.readers]
    children.rank_infos = infos[:: started.attn_tp_size]
    children.scheduler_info = infos[0]
    logger.info("scheduler ready %s", infos[0])
    return children


def launch_subprocesses(args: ServerArgs) -> ChildProcesses:
    """Start every child and return once every rank is ready."""
    return wait_until_ready(start_subprocesses(args))


def _wait_ready(children: ChildProcesses, reader: Any) -> dict[str, Any]:
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while not reader.poll(0.5):
        if children.dead() or time.monotonic() > deadline:
            children.shutdown()
            raise RuntimeError("scheduler process died or timed out during start-up; see its log")
    info: dict[str, Any] = reader.recv()
    if info.get("status") != "ready":
        children.shutdown()
        raise RuntimeError(f"scheduler failed to start: {info.get('message')}")
    return info
