"""Child-process hygiene: die with the parent, and name the process in logs."""

from __future__ import annotations

import ctypes
import os
import signal

from radixserve.logging_setup import configure_logging

PR_SET_PDEATHSIG = 1


def die_with_parent(parent_pid: int | None = None) -> None:
    """Ask Linux to SIGKILL this process when its parent dies (no orphans after a crash).

    A spawned child gets here only after unpickling its arguments (imports of torch and the
    engine: seconds); a parent that died meanwhile sends no signal any more, so the child
    also exits when its parent is already gone (`parent_pid`: the parent's pid at spawn)."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:  # not Linux: rely on the parent's orderly shutdown
        return
    if parent_pid is not None and os.getppid() != parent_pid:
        os._exit(1)


def configure_child_logging(level: str, role: str, fmt: str = "text") -> None:
    """A spawned child starts with bare logging: give it the server's level and format."""
    configure_logging(level, fmt, role)
