"""Tests for ServerArgs: validation names the field, unknown kwargs are rejected, chunk_size."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from radixserve.engine.configs.server_args import (
    DTYPES,
    EVICTION_POLICIES,
    POLICIES,
    ServerArgs,
)

INVALID: list[tuple[dict[str, Any], str]] = [
    ({"dtype": "float64"}, "dtype"),
    ({"page_size": 0}, "page_size"),
    ({"page_size": -4}, "page_size"),
    ({"max_total_tokens": 0}, "max_total_tokens"),
    ({"max_total_tokens": -1}, "max_total_tokens"),
    ({"mem_fraction_static": 0.0}, "mem_fraction_static"),
    ({"mem_fraction_static": 1.0}, "mem_fraction_static"),
    ({"mem_fraction_static": -0.5}, "mem_fraction_static"),
    ({"max_running_requests": 0}, "max_running_requests"),
    ({"max_prefill_tokens": 0}, "max_prefill_tokens"),
    ({"schedule_policy": "sjf"}, "schedule_policy"),
    ({"schedule_conservativeness": 0.0}, "schedule_conservativeness"),
    ({"schedule_conservativeness": -1.0}, "schedule_conservativeness"),
    ({"max_queued_requests": 0}, "max_queued_requests"),
    ({"radix_eviction_policy": "mru"}, "radix_eviction_policy"),
    ({"chunked_prefill_size": 0}, "chunked_prefill_size"),
    ({"chunked_prefill_size": -2}, "chunked_prefill_size"),
    ({"chunked_prefill_size": 15, "page_size": 16}, "chunked_prefill_size"),
]


@pytest.mark.parametrize(("kwargs", "field"), INVALID, ids=[f"{k}" for k, _ in INVALID])
def test_invalid_value_raises_naming_the_field(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(ValueError, match=rf"^{field}: "):
        ServerArgs(**kwargs)


@pytest.mark.parametrize(("kwargs", "field"), INVALID, ids=[f"{k}" for k, _ in INVALID])
def test_from_kwargs_validates_too(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(ValueError, match=rf"^{field}: "):
        ServerArgs.from_kwargs(**kwargs)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"page_size": 1},
        {"max_total_tokens": 1},
        {"mem_fraction_static": 0.01},
        {"mem_fraction_static": 0.99},
        {"max_running_requests": 1},
        {"max_prefill_tokens": 1},
        {"schedule_conservativeness": 0.01},
        {"max_queued_requests": 1},
        {"chunked_prefill_size": -1},
        {"chunked_prefill_size": None},
        {"chunked_prefill_size": 16, "page_size": 16},
        {"chunked_prefill_size": 1},
    ],
    ids=str,
)
def test_boundary_values_are_accepted(kwargs: dict[str, Any]) -> None:
    args = ServerArgs(**kwargs)
    for name, value in kwargs.items():
        assert getattr(args, name) == value


@pytest.mark.parametrize("policy", POLICIES)
def test_every_policy_is_accepted(policy: str) -> None:
    assert ServerArgs(schedule_policy=policy).schedule_policy == policy


@pytest.mark.parametrize("dtype", DTYPES)
def test_every_dtype_is_accepted(dtype: str) -> None:
    assert ServerArgs(dtype=dtype).dtype == dtype


@pytest.mark.parametrize("policy", EVICTION_POLICIES)
def test_every_eviction_policy_is_accepted(policy: str) -> None:
    assert ServerArgs(radix_eviction_policy=policy).radix_eviction_policy == policy


def test_defaults_are_valid() -> None:
    args = ServerArgs()
    assert args.page_size == 1
    assert args.max_prefill_tokens == 16384
    assert args.schedule_policy == "fcfs"
    assert args.chunk_size is None


def test_unknown_kwarg_is_rejected_by_name() -> None:
    with pytest.raises(ValueError, match="unknown engine argument.*'pp_size'"):
        ServerArgs.from_kwargs(pp_size=2)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"tp_size": 0}, "tp_size"),
        ({"tp_size": 4, "dp_size": 3, "enable_dp_attention": True}, "dp_size"),
        ({"tp_size": 2, "dp_size": 2, "ep_size": 8}, "ep_size"),
        ({"tp_size": 2}, "tp_size"),  # valid shape, but only 1 runs in this build
    ],
)
def test_parallelism_is_checked_and_refused_until_implemented(
    kwargs: dict[str, object], field: str
) -> None:
    with pytest.raises(ValueError, match=f"^{field}:"):
        ServerArgs.from_kwargs(**kwargs)


def test_all_unknown_kwargs_are_listed() -> None:
    with pytest.raises(ValueError) as info:
        ServerArgs.from_kwargs(page_size=4, zeta=1, alpha=2)
    assert "['alpha', 'zeta']" in str(info.value)


def test_from_kwargs_builds_known_fields() -> None:
    args = ServerArgs.from_kwargs(page_size=4, chunked_prefill_size=64, max_total_tokens=256)
    assert (args.page_size, args.chunked_prefill_size, args.max_total_tokens) == (4, 64, 256)


@pytest.mark.parametrize(("value", "expected"), [(-1, None), (None, None), (8, 8), (1, 1)])
def test_chunk_size_property(value: int | None, expected: int | None) -> None:
    assert ServerArgs(chunked_prefill_size=value).chunk_size == expected


@pytest.mark.parametrize(
    ("dtype", "device", "expected"),
    [("auto", "cpu", "float32"), ("auto", "cuda", "bfloat16"), ("float16", "cpu", "float16")],
)
def test_resolved_dtype(dtype: str, device: str, expected: str) -> None:
    assert ServerArgs(dtype=dtype, device=device).resolved_dtype == expected


def test_server_args_are_frozen() -> None:
    args = ServerArgs()
    with pytest.raises(dataclasses.FrozenInstanceError):
        args.page_size = 4  # type: ignore[misc]
