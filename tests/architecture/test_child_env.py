"""The processes the tests start never see TRITON_INTERPRET (tests/conftest.py sets it for the
test process only): a real child and a real router prove the helper, and a scan of tests/
holds every process launch to it.

The scan's rule, per file: every `subprocess.*` / `asyncio.create_subprocess_*` call passes
`env=` (a child never inherits os.environ as it is), and nothing copies os.environ whole
(`**os.environ`, `.items()`, `.copy()`, `dict(os.environ)`), so the only full environment a
test can hand a child is tests.child_env.child_env(). Reading or setting one variable stays
allowed. Processes started through multiprocessing (spawned test helpers) are the test
process's own and are not launches here.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.child_env import TEST_ONLY_VARS, child_env
from tests.conftest import has_cuda
from tests.router.router_proc import router_proc

TESTS = Path(__file__).resolve().parents[1]
LAUNCHERS = {
    "subprocess": {"Popen", "run", "call", "check_call", "check_output"},
    "asyncio": {"create_subprocess_exec", "create_subprocess_shell"},
    "os": {"system", "popen"},  # cannot take env= at all: never allowed
}
NOT_A_COPY = {"get", "setdefault", "pop"}  # os.environ.get(name) and the like: one variable
# What they start lives in containers or a kind cluster, which never inherit this environment.
CONTAINER_TOOLS = {
    "e2e/conftest.py": "kind, helm, kubectl",
    "e2e/kind.py": "kind, docker, kubectl",
    "e2e/test_kind.py": "kubectl",
    "deploy/image_check.py": "docker; the engine and router run in containers",
}
# Ratchet: launches not yet on child_env (files other work was changing at the time). It may
# only shrink: an entry whose file complies fails the test until it is removed.
NOT_YET = {
    "kernels/test_compile.py": "its env drops TRITON_INTERPRET by hand",
    "operator/test_operator_cli.py": "the operator (torch-free) from a filtered os.environ",
    "operator/test_kube_credentials.py": "openssl, inheriting",
}


def _is_environ(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.Attribute)
        and node.attr == "environ"
        and isinstance(node.value, ast.Name)
        and node.value.id == "os"
    )


def _launch_name(call: ast.Call) -> str | None:
    func = call.func
    if not (isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name)):
        return None
    return f"{func.value.id}.{func.attr}" if func.attr in LAUNCHERS.get(func.value.id, ()) else None


def violations(source: str) -> list[str]:
    """`line: what` for each launch without env= and each whole copy of os.environ."""
    tree = ast.parse(source)
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and (name := _launch_name(node)):
            if not any(k.arg == "env" for k in node.keywords):
                found.append(f"{node.lineno}: {name} without env=child_env(...)")
        elif _is_environ(node):
            parent = parents[node]
            read = isinstance(parent, ast.Subscript) or (
                isinstance(parent, ast.Attribute) and parent.attr in NOT_A_COPY
            )
            if not read and not isinstance(parent, ast.Compare):  # `"X" in os.environ`
                found.append(f"{node.lineno}: copies os.environ (use child_env)")
    return found


def test_child_env_leaves_out_what_only_the_test_process_may_see(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setenv("RADIXSERVE_PROBE", "kept")
    code = "import os; print(os.environ.get('TRITON_INTERPRET'), os.environ['RADIXSERVE_PROBE'])"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=child_env()
    )
    assert out.stdout.split() == ["None", "kept"]
    assert child_env({"TRITON_INTERPRET": "1"})["TRITON_INTERPRET"] == "1"  # asked for: given
    assert "TRITON_INTERPRET" in TEST_ONLY_VARS


def test_the_test_process_interprets_kernels_without_cuda() -> None:
    """tests/conftest.py set TRITON_INTERPRET before this module imported anything: kernels
    imported now, whatever imports them first in a run, are decorated for the interpreter."""
    if has_cuda():
        pytest.skip("a CUDA device: the kernels compile, TRITON_INTERPRET stays unset")
    assert os.environ.get("TRITON_INTERPRET") == "1"
    from radixserve.kernels import triton_util

    assert triton_util.interpreted()


@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="no /proc to read")
def test_a_started_router_does_not_see_triton_interpret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    with router_proc([]) as router:
        names = {
            entry.split(b"=", 1)[0].decode()
            for entry in Path(f"/proc/{router.proc.pid}/environ").read_bytes().split(b"\0")
            if entry
        }
    assert "TRITON_INTERPRET" not in names
    assert "PATH" in names  # the rest of the environment is there


def test_every_launch_in_the_tests_goes_through_child_env() -> None:
    found = {}
    for path in sorted(TESTS.rglob("*.py")):
        name = path.relative_to(TESTS).as_posix()
        if name in CONTAINER_TOOLS or name == "child_env.py":
            continue
        if bad := violations(path.read_text()):
            found[name] = bad
    assert sorted(set(found) - set(NOT_YET)) == [], {k: found[k] for k in found if k not in NOT_YET}
    assert sorted(set(NOT_YET) - set(found)) == [], "complies now: remove it from NOT_YET"


def test_the_scan_catches_an_inheriting_launch_and_a_copied_environ() -> None:
    source = (
        "import os, subprocess\n"
        "subprocess.run(['x'])\n"
        "subprocess.Popen(['x'], env={**os.environ, 'A': '1'})\n"
        "os.environ.get('HOME'), os.environ['HOME'], 'HOME' in os.environ\n"
        "subprocess.run(['x'], env=child_env())\n"
    )
    assert violations(source) == [
        "2: subprocess.run without env=child_env(...)",
        "3: copies os.environ (use child_env)",
    ]
    assert os.environ.get("PATH")  # the scan reads source only
