"""A spawned engine child whose parent died before the child could ask Linux for a death signal
(it unpickles its arguments first: seconds of imports) exits at once instead of living on as
an orphan; a child whose parent is alive carries on. Real spawned processes."""

from __future__ import annotations

import multiprocessing as mp
import os
import sys

import pytest

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="prctl(PR_SET_PDEATHSIG)")


def _child(parent_pid: int) -> None:
    from radixserve.engine.entrypoints.process_utils import die_with_parent

    die_with_parent(parent_pid)
    sys.exit(0)  # reached only while the parent it was spawned by is alive


@pytest.mark.parametrize(("parent", "exitcode"), [("alive", 0), ("gone", 1)])
def test_child_exits_when_its_parent_is_already_gone(parent: str, exitcode: int) -> None:
    ctx = mp.get_context("spawn")
    # "gone": the pid the child was told to belong to is not its parent any more (pid 1 never
    # spawns test children), as after its real parent died and it was re-parented
    expected = os.getpid() if parent == "alive" else 1
    proc = ctx.Process(target=_child, args=(expected,))
    proc.start()
    proc.join(60)
    assert proc.exitcode == exitcode
