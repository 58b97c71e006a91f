"""Child-process hygiene: die with the parent, and name the process in logs."""

from __future__ import annotations

import ctypes
import logging
import signal

PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """Ask Linux to SIGKILL this process when its parent dies (no orphans after a crash)."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:  # not Linux: rely on the parent's orderly shutdown
        pass


def configure_child_logging(level: str, role: str) -> None:
    logging.basicConfig(
        level=level.upper(),
        format=f"%(asctime)s level=%(levelname)s process={role} logger=%(name)s %(message)s",
    )
