"""The operator's names are the components' own: `flag_choices.json` is what the engine's and
the router's config metadata write today (radixserve.golden_names), the spec parser accepts
exactly those policy names, and the CRD's enums and docs/operator.md list the same ones."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from radixserve.golden_names import render
from radixserve.operator import flag_choices
from radixserve.operator.flag_choices import (
    ENGINE_POLICIES,
    HICACHE_WRITE_POLICIES,
    ROUTER_POLICIES,
)
from radixserve.operator.schema import SpecError
from radixserve.operator.spec import parse_spec
from tests.operator.cases import spec_with

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = Path(flag_choices.__file__).with_name("flag_choices.json")
CRDS = [
    ROOT / "manifests" / "crds" / "inferenceservices.radixserve.io.yaml",
    ROOT / "charts" / "radixserve" / "crds" / "inferenceservices.radixserve.io.yaml",
]
# (spec path, the CRD property under spec, the operator's names)
POLICY_FIELDS = [
    ("engine.scheduler.policy", ("engine", "scheduler", "policy"), ENGINE_POLICIES),
    ("router.policy", ("router", "policy"), ROUTER_POLICIES),
    (
        "engine.kvCache.offload.writePolicy",
        ("engine", "kvCache", "offload", "writePolicy"),
        HICACHE_WRITE_POLICIES,
    ),
]
IDS = [path for path, _, _ in POLICY_FIELDS]


def test_golden_file_is_what_the_components_write() -> None:
    assert GOLDEN.read_text() == render(), (
        "stale: python -m radixserve.golden_names > operator/radixserve/operator/flag_choices.json"
    )


def test_operator_names_are_the_engines_and_the_routers() -> None:
    from radixserve.engine.configs.server_args import SCHEDULE_POLICIES
    from radixserve.router.policies import POLICIES

    assert ENGINE_POLICIES == SCHEDULE_POLICIES
    assert tuple(POLICIES) == ROUTER_POLICIES


@pytest.mark.parametrize(("path", "prop", "names"), POLICY_FIELDS, ids=IDS)
def test_spec_accepts_exactly_the_components_names(
    path: str, prop: tuple[str, ...], names: tuple[str, ...]
) -> None:
    for name in names:
        parse_spec(spec_with(path, name), "chat")
    with pytest.raises(SpecError, match=rf"must be one of {', '.join(names)}, got 'nope'"):
        parse_spec(spec_with(path, "nope"), "chat")


def _crd_property(crd: Path, prop: tuple[str, ...]) -> dict[str, Any]:
    doc = yaml.safe_load(crd.read_text())
    node = doc["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    for key in prop:
        node = node["properties"][key]
    return dict(node)


@pytest.mark.parametrize("crd", CRDS, ids=lambda p: str(p.relative_to(ROOT)))
@pytest.mark.parametrize(("path", "prop", "names"), POLICY_FIELDS, ids=IDS)
def test_crd_enums_are_the_components_names(
    crd: Path, path: str, prop: tuple[str, ...], names: tuple[str, ...]
) -> None:
    assert tuple(_crd_property(crd, prop)["enum"]) == names, f"{crd.name}: spec.{path}"


@pytest.mark.parametrize(("path", "prop", "names"), POLICY_FIELDS, ids=IDS)
def test_docs_list_the_components_names(
    path: str, prop: tuple[str, ...], names: tuple[str, ...]
) -> None:
    row = next(
        line
        for line in (ROOT / "docs" / "operator.md").read_text().splitlines()
        if line.startswith(f"| `{path}` |")
    )
    allowed = row.split("|")[3]  # | field | default | values |
    assert tuple(re.findall(r"`([^`]+)`", allowed.split("(")[0])) == names
