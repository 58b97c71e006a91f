"""Child-process hygiene: die with the parent, and name the process in logs."""

from __future__ import annotations

import ctypes
import signal

from radixserve.logging_setup import configure_logging

PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """Ask Linux to SIGKILL this process when its parent dies (no orphans after a crash)."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:  # not Linux: rely on the parent's orderly shutdown
        pass


def configure_child_logging(level: str, role: str, fmt: str = "text") -> None:
    """A spawned child starts with bare logging: give it the server's level and format."""
    configure_logging(level, fmt, role)
