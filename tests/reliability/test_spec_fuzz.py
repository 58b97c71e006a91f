"""Bad input to the operator: InferenceService specs mutated by hypothesis (a field replaced by
any JSON value, removed, or an unknown one added) parse or fail with a SpecError naming the
field, never with another exception (which would crash the reconcile instead of setting an
honest status)."""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from radixserve.operator.schema import SpecError
from radixserve.operator.spec import parse_spec
from tests.operator.cases import CASES

KEYS = st.text(max_size=8)
JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=16),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(KEYS, inner, max_size=3),
    max_leaves=8,
)  # fmt: skip


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(node, dict):
        for k, v in node.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out += _paths(v, (*prefix, i))
    return out


@st.composite
def mutated_specs(draw: st.DrawFn) -> Any:
    spec = copy.deepcopy(CASES[draw(st.sampled_from(sorted(CASES)))])
    for _ in range(draw(st.integers(1, 3))):
        paths = _paths(spec)
        path = draw(st.sampled_from(paths))
        if not path:
            spec = draw(JSON) if draw(st.booleans()) else spec
            continue
        parent = spec
        for key in path[:-1]:
            parent = parent[key]
        action = draw(st.sampled_from(["replace", "remove", "add"]))
        if action == "replace":
            parent[path[-1]] = draw(JSON)
        elif action == "remove":
            del parent[path[-1]]
        elif isinstance(parent, dict):
            parent[draw(st.text(min_size=1, max_size=8))] = draw(JSON)
        if not isinstance(spec, dict):
            break
    return spec


@settings(max_examples=600, deadline=None)
@given(spec=mutated_specs())
def test_mutated_specs_parse_or_name_the_field(spec: Any) -> None:
    try:
        parse_spec(spec, "fuzzed")
    except SpecError as exc:
        assert exc.field.startswith("spec"), exc  # a path from the spec's root
