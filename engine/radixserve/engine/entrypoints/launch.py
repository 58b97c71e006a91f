"""Starts a replica's child processes (scheduler, detokenizer), waits for the start-up
handshake, watches them, and shuts them down in order.

Children are spawned (not forked: torch and ZMQ state must not be shared), ignore SIGINT
(the parent owns Ctrl-C) and are SIGKILLed by the kernel if the parent dies.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import signal
import time
from dataclasses import dataclass, field
from multiprocessing.process import BaseProcess
from typing import Any

from radixserve.engine.configs.server_args import ServerArgs
from radixserve.engine.entrypoints.process_utils import configure_child_logging, die_with_parent
from radixserve.engine.ipc.channels import PortArgs

logger = logging.getLogger(__name__)

STARTUP_TIMEOUT_S = 600.0


def _scheduler_main(args: ServerArgs, ports: PortArgs, writer: Any, dp_rank: int) -> None:
    die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    configure_child_logging(args.log_level, f"scheduler-{dp_rank}")
    from radixserve.engine.managers.scheduler_process import run_scheduler_process

    run_scheduler_process(args, ports, writer, dp_rank)


def _detokenizer_main(args: ServerArgs, ports: PortArgs) -> None:
    die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    configure_child_logging(args.log_level, "detokenizer")
    from radixserve.engine.managers.detokenizer_manager import run_detokenizer_process

    run_detokenizer_process(args.model_path, ports, args.revision)


@dataclass(slots=True)
class ChildProcesses:
    ports: PortArgs
    scheduler_info: dict[str, Any]
    procs: list[BaseProcess] = field(default_factory=list)
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


def launch_subprocesses(args: ServerArgs) -> ChildProcesses:
    """Start scheduler + detokenizer; return once the scheduler reports ready."""
    ctx = mp.get_context("spawn")
    ports = PortArgs.create()
    reader, writer = ctx.Pipe(duplex=False)
    sched = ctx.Process(
        target=_scheduler_main,
        args=(args, ports, writer, 0),
        name="radixserve-scheduler-0",
        daemon=True,
    )
    detok = ctx.Process(
        target=_detokenizer_main, args=(args, ports), name="radixserve-detokenizer", daemon=True
    )
    children = ChildProcesses(ports, {}, [sched, detok])
    sched.start()
    detok.start()
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while not reader.poll(0.5):
        if children.dead() or time.monotonic() > deadline:
            children.shutdown()
            raise RuntimeError("scheduler process died or timed out during start-up; see its log")
    info = reader.recv()
    if info.get("status") != "ready":
        children.shutdown()
        raise RuntimeError(f"scheduler failed to start: {info.get('message')}")
    children.scheduler_info = info
    logger.info("scheduler ready %s", info)
    return children
