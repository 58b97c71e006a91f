"""The import contracts (.importlinter) hold, and they bite: an injected forbidden import fails,
one under `if TYPE_CHECKING:` too (an annotation names a type of the imported layer all the same).

Every check runs `lint-imports` or grimp in a fresh interpreter whose `sys.path` holds only the
source roots under test: the installed .pth puts this checkout's roots on every interpreter's
path, and a namespace package would merge the checkout's portions with the copy's.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.child_env import child_env

ROOT = Path(__file__).resolve().parents[2]
SOURCE_ROOTS = ["common", "engine", "kernels", "router", "operator"]

# Runs in the child: the checkout's roots off sys.path, the given roots on, then one command.
BOOTSTRAP = """
import sys
roots = sys.argv[1].split(":")
installed = {sys.argv[2] + "/" + r for r in ("common", "engine", "kernels", "router", "operator")}
sys.path[:] = roots + [p for p in sys.path if p not in installed]
"""

LINT = (
    BOOTSTRAP
    + """
from importlinter.cli import lint_imports
sys.exit(lint_imports(config_filename=sys.argv[3], no_cache=True))
"""
)

# Subpackage-level import graph (engine subpackages one level down, other components whole),
# annotation-only imports included, printed as JSON {importer: [imported, ...]}.
GRAPH = (
    BOOTSTRAP
    + """
import json, grimp
graph = grimp.build_graph("radixserve", cache_dir=None, exclude_type_checking_imports=False)
def unit(m):
    parts = m.split(".")
    return ".".join(parts[:3] if parts[1] == "engine" and len(parts) > 2 else parts[:2])
edges = {}
for m in graph.modules:
    for imported in graph.find_modules_directly_imported_by(m):
        a, b = unit(m), unit(imported)
        if a != b:
            edges.setdefault(a, set()).add(b)
print(json.dumps({k: sorted(v) for k, v in edges.items()}))
"""
)


def _run(script: str, tree: Path, *args: str) -> subprocess.CompletedProcess[str]:
    roots = ":".join(str(tree / r) for r in SOURCE_ROOTS)
    return subprocess.run(
        [sys.executable, "-c", script, roots, str(ROOT), *args],
        capture_output=True, text=True, cwd=tree, timeout=300, env=child_env(),
    )  # fmt: skip


def _copy_tree(dest: Path) -> Path:
    for r in SOURCE_ROOTS:
        shutil.copytree(ROOT / r, dest / r, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / ".importlinter", dest / ".importlinter")
    return dest


def _annotation_only(module: str) -> str:
    """An import that never runs: only a type checker follows it."""
    return f"from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import {module}"


def test_contracts_hold_on_this_checkout() -> None:
    result = _run(LINT, ROOT, str(ROOT / ".importlinter"))
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]


@pytest.mark.parametrize(
    ("module", "line", "contract"),
    [
        ("router/radixserve/router/policies/base.py", "import torch", "never import the engine"),
        (
            "router/radixserve/router/proxy.py",
            "import radixserve.engine.ipc.messages",
            "never import the engine",
        ),
        ("router/radixserve/router/proxy.py", "import radixserve.operator", "independent of each"),
        (
            "engine/radixserve/engine/mem_cache/radix_cache.py",
            "import radixserve.engine.scheduler.req",
            "mem_cache knows no process package",
        ),
        (
            "engine/radixserve/engine/mem_cache/radix_cache.py",
            _annotation_only("radixserve.engine.scheduler.req"),
            "mem_cache knows no process package",
        ),
        (
            "engine/radixserve/engine/attention/base.py",
            _annotation_only("radixserve.engine.layers.radix_attention"),
            "engine layers",
        ),
        (
            "engine/radixserve/engine/forward_batch/forward_batch_info.py",
            _annotation_only("radixserve.engine.attention.base"),
            "engine layers",
        ),
        (
            "engine/radixserve/engine/models/llama.py",
            _annotation_only("radixserve.engine.model_executor.model_runner"),
            "engine layers",
        ),
        (
            "engine/radixserve/engine/models/llama.py",
            "import radixserve.engine.scheduler.scheduler",
            "know no scheduler",
        ),
        (
            "engine/radixserve/engine/scheduler/scheduler.py",
            "import radixserve.engine.tokenizer.metrics",
            "one package per process",
        ),
        (
            "engine/radixserve/engine/tokenizer/tokenizer_manager.py",
            "import radixserve.engine.detokenizer.incremental_detokenizer",
            "one package per process",
        ),
        (
            "engine/radixserve/engine/detokenizer/detokenizer_manager.py",
            "import radixserve.engine.scheduler.req",
            "one package per process",
        ),
        ("common/radixserve/protocol/kv_events.py", "import radixserve.router", "protocol depends"),
        (
            "kernels/radixserve/kernels/__init__.py",
            "import radixserve.engine",
            "kernels know no engine",
        ),
    ],
    ids=lambda value: " ".join(value.split()),  # an annotation-only injection spans lines
)
def test_an_injected_forbidden_import_breaks_a_contract(
    tmp_path: Path, module: str, line: str, contract: str
) -> None:
    tree = _copy_tree(tmp_path)
    target = tree / module
    text = target.read_text()
    # After the docstring and `from __future__`, so the file stays valid Python.
    head, sep, tail = text.partition("from __future__ import annotations\n")
    target.write_text(head + sep + line + "  # injected\n" + tail if sep else line + "\n" + text)
    result = _run(LINT, tree, str(tree / ".importlinter"))
    assert result.returncode != 0, f"{line!r} in {module} went unnoticed:\n{result.stdout[-3000:]}"
    # lint-imports wraps long lines; compare with the line breaks taken out.
    broken = result.stdout.split("Broken contracts", 1)[-1].replace("\n", "")
    importer = module.split("/", 1)[1].removesuffix(".py").removesuffix("/__init__")
    assert contract in broken
    assert importer.replace("/", ".") in broken


def _cycles(edges: dict[str, list[str]]) -> list[tuple[str, str]]:
    """Pairs (a, b) with a path a → … → b → … → a, by reachability over the unit graph."""

    def reachable(start: str) -> set[str]:
        seen, todo = set(), [start]
        while todo:
            for nxt in edges.get(todo.pop(), []):
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return seen

    reach = {a: reachable(a) for a in edges}
    return sorted((a, b) for a in reach for b in reach[a] if a < b and a in reach.get(b, set()))


@pytest.fixture(scope="module")
def edges() -> dict[str, list[str]]:
    result = _run(GRAPH, ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    graph: dict[str, list[str]] = json.loads(result.stdout)
    assert "radixserve.engine.scheduler" in graph  # the graph really was built
    return graph


def test_no_subpackage_import_cycle(edges: dict[str, list[str]]) -> None:
    assert _cycles(edges) == []


def _listing(edges: dict[str, list[str]]) -> str:
    """The graph as docs/development.md lists it: one importer a line, `radixserve.` left off."""

    def short(unit: str) -> str:
        return unit.removeprefix("radixserve.")

    return "".join(
        f"{short(a):28} → {', '.join(short(b) for b in edges[a])}\n" for a in sorted(edges)
    )


def test_the_documented_graph_is_this_checkouts(edges: dict[str, list[str]]) -> None:
    doc = (ROOT / "docs" / "development.md").read_text()
    block = re.search(r"## The import graph\n.*?```\n(.*?)```", doc, re.DOTALL)
    assert block is not None, "docs/development.md has no import graph listing"
    assert block.group(1) == _listing(edges), "update the listing to:\n" + _listing(edges)
