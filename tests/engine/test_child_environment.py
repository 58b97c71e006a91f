"""The spawned children's OpenMP wait settings: on a CPU device they start with our short
GOMP_SPINCOUNT unless the user set a wait variable, and the parent's environment is left as it
was. Read back from a real spawned child (as the scheduler processes are started)."""

from __future__ import annotations

import multiprocessing as mp
import os
from multiprocessing.connection import Connection

import pytest

from radixserve.engine.configs.server_args import ServerArgs
from radixserve.engine.entrypoints.launch import CPU_CHILD_ENV, OMP_WAIT_VARS, _child_environment


def _report(conn: Connection) -> None:
    conn.send({name: os.environ.get(name) for name in OMP_WAIT_VARS})
    conn.close()


def _seen_by_a_child(args: ServerArgs) -> dict[str, str | None]:
    ctx = mp.get_context("spawn")
    reader, writer = ctx.Pipe(duplex=False)
    with _child_environment(args):
        child = ctx.Process(target=_report, args=(writer,))
        child.start()
    seen: dict[str, str | None] = reader.recv()
    child.join(30)
    return seen


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in OMP_WAIT_VARS:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_cpu_children_get_the_short_spin_and_the_parent_keeps_its_env(
    clean_env: pytest.MonkeyPatch,
) -> None:
    seen = _seen_by_a_child(ServerArgs(device="cpu"))
    assert seen == {"GOMP_SPINCOUNT": CPU_CHILD_ENV["GOMP_SPINCOUNT"], "OMP_WAIT_POLICY": None}
    assert not any(name in os.environ for name in OMP_WAIT_VARS)


@pytest.mark.parametrize(
    ("name", "value"), [("OMP_WAIT_POLICY", "PASSIVE"), ("GOMP_SPINCOUNT", "300000")]
)
def test_a_wait_setting_of_the_user_wins(
    clean_env: pytest.MonkeyPatch, name: str, value: str
) -> None:
    clean_env.setenv(name, value)
    seen = _seen_by_a_child(ServerArgs(device="cpu"))
    assert seen == {n: (value if n == name else None) for n in OMP_WAIT_VARS}
    assert os.environ[name] == value


def test_gpu_children_get_nothing(clean_env: pytest.MonkeyPatch) -> None:
    seen = _seen_by_a_child(ServerArgs(device="cuda"))
    assert seen == dict.fromkeys(OMP_WAIT_VARS)
