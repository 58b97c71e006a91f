"""Structural rules: torch-free components stay torch-free, modules stay small."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.child_env import child_env

ROOT = Path(__file__).resolve().parents[2]
MAX_MODULE_LINES = 800
SOURCE_DIRS = ["common", "engine", "kernels", "router", "operator"]

PROBE = """
import sys, importlib, pkgutil
pkg = importlib.import_module({name!r})
for m in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + "."):
    importlib.import_module(m.name)
bad = sorted(m for m in sys.modules
          if m == "torch" or m.startswith(("torch.", "radixserve.engine")))
print(",".join(bad))
"""


@pytest.mark.parametrize(
    "package", ["radixserve.protocol", "radixserve.router", "radixserve.operator", "radixserve.cli"]
)
def test_torch_free_packages_import_neither_torch_nor_engine(package: str) -> None:
    # A fresh interpreter per package: sys.modules in this one already holds torch.
    code = (
        PROBE.format(name=package)
        if package != "radixserve.cli"
        else (
            "import sys, radixserve.cli; print(','.join(sorted(m for m in sys.modules "
            "if m == 'torch' or m.startswith(('torch.', 'radixserve.engine')))))"
        )
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        cwd="/",
        env=child_env(),
    )
    assert result.stdout.strip() == "", f"{package} imports {result.stdout.strip()}"


def test_the_server_starts_its_children_before_it_imports_torch() -> None:
    """`radixserve serve` spawns its scheduler and detokenizer from `launch` before importing
    torch and the HTTP stack, so their start-ups overlap; `launch` importing torch (or the
    engine's torch modules) would put those imports back in front of the children."""
    code = (
        "import sys, radixserve.engine.entrypoints.launch; print(','.join(sorted(m for m in "
        "sys.modules if m == 'torch' or m.startswith('torch.'))))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd="/",
        env=child_env(),
    )  # fmt: skip
    assert result.stdout.strip() == "", f"launch imports {result.stdout.strip()}"


def _python_files() -> list[Path]:
    files: list[Path] = []
    for d in SOURCE_DIRS:
        files += sorted((ROOT / d).rglob("*.py"))
    return files


def test_no_module_exceeds_line_ceiling() -> None:
    too_big = {
        str(p.relative_to(ROOT)): n
        for p in _python_files()
        if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert too_big == {}


def test_no_global_statements() -> None:
    offenders = [
        str(p.relative_to(ROOT))
        for p in _python_files()
        if any(line.lstrip().startswith("global ") for line in p.read_text().splitlines())
    ]
    assert offenders == []


def test_every_module_has_a_docstring() -> None:
    import ast

    missing = [
        str(p.relative_to(ROOT))
        for p in _python_files()
        if p.stat().st_size and ast.get_docstring(ast.parse(p.read_text())) is None
    ]
    assert missing == []
