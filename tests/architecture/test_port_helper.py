"""Ports in the test suite come from tests/ports.py alone: no private copy of "bind port 0 and
read what the kernel gave" may come back (three of them once handed out the same port twice,
and one failed CI with "Address already in use")."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]
HELPER = TESTS / "ports.py"
BINDS = {"bind", "create_server"}  # socket.bind((host, 0)), socket.create_server((host, 0))
Function = ast.FunctionDef | ast.AsyncFunctionDef


def _binds_port_zero(node: ast.AST) -> bool:
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute | ast.Name):
        return False
    name = node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id
    address = node.args[0] if node.args else None
    return (
        name in BINDS
        and isinstance(address, ast.Tuple)
        and len(address.elts) >= 2
        and isinstance(address.elts[1], ast.Constant)
        and address.elts[1].value == 0
    )


def _reads_port(node: ast.AST | None) -> bool:
    return node is not None and any(
        isinstance(n, ast.Attribute) and n.attr == "getsockname" for n in ast.walk(node)
    )


def _hands_out_a_port(fn: Function) -> bool:
    """It binds to port 0 and returns (or yields) the port the kernel chose: the socket is
    gone by the time the caller binds the port, which anyone may have taken meanwhile. A
    socket bound to port 0 and kept (a listener the test holds) is fine."""
    if not any(_binds_port_zero(n) for n in ast.walk(fn)):
        return False
    picked = {
        t.id
        for n in ast.walk(fn)
        if isinstance(n, ast.Assign) and _reads_port(n.value)
        for t in n.targets
        if isinstance(t, ast.Name)
    }
    handed = [n.value for n in ast.walk(fn) if isinstance(n, ast.Return | ast.Yield)]
    return any(_reads_port(v) or (isinstance(v, ast.Name) and v.id in picked) for v in handed)


def _port_pickers(tree: ast.AST) -> list[int]:
    """Lines of functions that pick a port by binding port 0 (or are named for it), and of
    calls that ask zmq for a random port."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, Function) and ("free_port" in node.name or _hands_out_a_port(node)):
            lines.append(node.lineno)
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "bind_to_random_port"
        ):
            lines.append(node.lineno)
    return sorted(lines)


PICK = """def pick():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
"""
KEEP = """def __init__(self):
    self.listener = socket.create_server(("127.0.0.1", 0))
    self.port = self.listener.getsockname()[1]
"""


@pytest.mark.parametrize(
    ("source", "found"),
    [
        (PICK, [1]),
        (
            PICK.replace("return int(s.getsockname()[1])", "port = s.getsockname()[1]")
            + "    return port\n",
            [1],
        ),
        ("def pick():\n    s = socket.create_server(('', 0))\n    yield s.getsockname()\n", [1]),
        ("port = sock.bind_to_random_port('tcp://127.0.0.1')\n", [1]),
        ("def _free_port() -> int:\n    return 1\n", [1]),
        (KEEP, []),
        ("def f():\n    return bind_retrying(listening_socket).getsockname()\n", []),
    ],
)
def test_the_check_finds_a_port_picker(source: str, found: list[int]) -> None:
    assert _port_pickers(ast.parse(source)) == found


def test_no_private_port_pickers() -> None:
    offenders = {
        str(path.relative_to(TESTS.parent)): lines
        for path in sorted(TESTS.rglob("*.py"))
        if path != HELPER and (lines := _port_pickers(ast.parse(path.read_text())))
    }
    assert offenders == {}, "pick ports with tests/ports.py (free_port, bind_retrying)"
