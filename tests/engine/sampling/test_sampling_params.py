"""Tests for SamplingParams: defaults, from_dict parsing, verify ranges, normalize."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest

from radixserve.engine.sampling import SamplingParams

SGLANG_DEFAULTS: dict[str, Any] = {
    "max_new_tokens": 128,
    "stop": None,
    "stop_token_ids": None,
    "temperature": 1.0,
    "top_p": 1.0,
    "top_k": -1,
    "min_p": 0.0,
    "frequency_penalty": 0.0,
    "presence_penalty": 0.0,
    "repetition_penalty": 1.0,
    "min_new_tokens": 0,
    "ignore_eos": False,
    "skip_special_tokens": True,
    "spaces_between_special_tokens": True,
    "no_stop_trim": False,
    "n": 1,
    "sampling_seed": None,
    "logit_bias": None,
    "json_schema": None,
    "regex": None,
    "ebnf": None,
    "structural_tag": None,
}


def test_defaults_match_sglang() -> None:
    assert dataclasses.asdict(SamplingParams()) == SGLANG_DEFAULTS


def test_defaults_pass_verify() -> None:
    SamplingParams().verify(vocab_size=10)


def test_from_dict_none_gives_defaults() -> None:
    assert SamplingParams.from_dict(None) == SamplingParams()


def test_from_dict_round_trips_every_field() -> None:
    params = SamplingParams(stop=["x"], stop_token_ids=[2], sampling_seed=7, logit_bias={3: 1.5})
    assert SamplingParams.from_dict(dataclasses.asdict(params)) == params


def test_from_dict_sets_given_fields() -> None:
    params = SamplingParams.from_dict({"temperature": 0.5, "top_k": 20, "stop": "\n"})
    assert (params.temperature, params.top_k, params.stop) == (0.5, 20, "\n")


def test_from_dict_rejects_unknown_key() -> None:
    with pytest.raises(ValueError, match="unknown sampling parameter 'xyz'"):
        SamplingParams.from_dict({"xyz": 1})


def test_from_dict_widens_int_to_float() -> None:
    params = SamplingParams.from_dict({"temperature": 1})
    assert isinstance(params.temperature, float)


def test_from_dict_accepts_json_string_keys_for_logit_bias() -> None:
    params = SamplingParams.from_dict({"logit_bias": {"42": -100}})
    assert params.logit_bias == {42: -100.0}


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("temperature", "hot"),
        ("temperature", True),
        ("top_p", None),
        ("max_new_tokens", 1.5),
        ("max_new_tokens", True),
        ("top_k", 2.0),
        ("n", "2"),
        ("ignore_eos", 1),
        ("stop", 3),
        ("stop", ["a", 1]),
        ("stop_token_ids", "1"),
        ("stop_token_ids", [1.0]),
        ("sampling_seed", "1"),
        ("logit_bias", [1]),
        ("logit_bias", {"x": 1.0}),
        ("logit_bias", {1: "big"}),
    ],
)
def test_from_dict_rejects_wrong_type_naming_field(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=field):
        SamplingParams.from_dict({field: value})


@pytest.mark.parametrize(
    ("field", "kwargs", "vocab_size"),
    [
        ("max_new_tokens", {"max_new_tokens": -1}, None),
        ("temperature", {"temperature": -0.1}, None),
        ("temperature", {"temperature": math.nan}, None),
        ("top_p", {"top_p": 0.0}, None),
        ("top_p", {"top_p": 1.01}, None),
        ("top_p", {"top_p": -0.5}, None),
        ("top_k", {"top_k": 0}, None),
        ("top_k", {"top_k": -2}, None),
        ("min_p", {"min_p": -0.1}, None),
        ("min_p", {"min_p": 1.1}, None),
        ("frequency_penalty", {"frequency_penalty": -2.1}, None),
        ("frequency_penalty", {"frequency_penalty": 2.1}, None),
        ("presence_penalty", {"presence_penalty": -2.1}, None),
        ("presence_penalty", {"presence_penalty": 2.1}, None),
        ("repetition_penalty", {"repetition_penalty": 0.0}, None),
        ("repetition_penalty", {"repetition_penalty": 2.1}, None),
        ("min_new_tokens", {"min_new_tokens": -1}, None),
        ("min_new_tokens", {"min_new_tokens": 6, "max_new_tokens": 5}, None),
        ("n", {"n": 0}, None),
        ("stop", {"stop": ""}, None),
        ("stop", {"stop": ["ok", ""]}, None),
        ("stop_token_ids", {"stop_token_ids": [-1]}, None),
        ("stop_token_ids", {"stop_token_ids": [50]}, 50),
        ("logit_bias", {"logit_bias": {50: 1.0}}, 50),
        ("logit_bias", {"logit_bias": {-1: 1.0}}, None),
    ],
)
def test_verify_rejects_out_of_range_naming_field(
    field: str, kwargs: dict[str, Any], vocab_size: int | None
) -> None:
    with pytest.raises(ValueError) as excinfo:
        SamplingParams(**kwargs).verify(vocab_size)
    assert str(excinfo.value).startswith(field)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"temperature": 0.0},
        {"top_p": 1.0},
        {"top_k": 1},
        {"min_p": 0.0},
        {"min_p": 1.0},
        {"frequency_penalty": -2.0},
        {"presence_penalty": 2.0},
        {"repetition_penalty": 2.0},
        {"min_new_tokens": 5, "max_new_tokens": 5},
        {"max_new_tokens": 0},
        {"stop_token_ids": [0, 49]},
        {"logit_bias": {49: -100.0}},
    ],
)
def test_verify_accepts_boundary_values(kwargs: dict[str, Any]) -> None:
    SamplingParams(**kwargs).verify(vocab_size=50)


def test_verify_without_vocab_size_skips_upper_bound() -> None:
    SamplingParams(stop_token_ids=[10**6]).verify()


@pytest.mark.parametrize("temperature", [0.0, 1e-7])
def test_near_zero_temperature_normalizes_to_greedy(temperature: float) -> None:
    params = SamplingParams(temperature=temperature, top_k=40)
    params.normalize()
    assert (params.top_k, params.temperature, params.is_greedy) == (1, 1.0, True)


def test_small_but_positive_temperature_is_not_greedy() -> None:
    params = SamplingParams(temperature=1e-3)
    params.normalize()
    assert (params.top_k, params.temperature, params.is_greedy) == (-1, 1e-3, False)


def test_zero_temperature_is_greedy_before_normalize() -> None:
    assert SamplingParams(temperature=0.0).is_greedy


def test_normalize_is_idempotent() -> None:
    once = SamplingParams(temperature=0.0, stop="x")
    once.normalize()
    twice = dataclasses.replace(once)
    twice.normalize()
    assert twice == once


def test_normalize_turns_stop_string_into_list() -> None:
    params = SamplingParams(stop="###")
    params.normalize()
    assert params.stop == ["###"]


@pytest.mark.parametrize(("stop", "expected"), [(None, []), ("a", ["a"]), (["a", "b"], ["a", "b"])])
def test_stop_strs(stop: str | list[str] | None, expected: list[str]) -> None:
    assert SamplingParams(stop=stop).stop_strs == expected


# ---- from_dict: msgspec's typed conversion, errors led by the field name -----------------------


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"temperature": -1}, "temperature: must be >= 0, got -1"),
        ({"n": 0}, "n: must be >= 1, got 0"),
        ({"top_p": 0.0}, "top_p: must be in (0, 1], got 0.0"),
        ({"min_p": 1.5}, "min_p: must be in [0, 1], got 1.5"),
        ({"presence_penalty": -3}, "presence_penalty: must be in [-2, 2], got -3"),
        ({"repetition_penalty": 2.5}, "repetition_penalty: must be in (0, 2], got 2.5"),
        ({"temperature": True}, "temperature: expected `float`, got `bool`"),
        ({"max_new_tokens": 1.5}, "max_new_tokens: expected `int`, got `float`"),
        ({"top_p": None}, "top_p: expected `float`, got `null`"),
        (
            {"stop_token_ids": [3, -1]},
            "stop_token_ids: expected `int` >= 0 (at `$.stop_token_ids[1]`)",
        ),
        (
            {"logit_bias": {"x": 1}},
            "logit_bias: expected `int`, got `str` (at `key` in `$.logit_bias`)",
        ),
        ({"top_k": 0}, "top_k: must be -1 (whole vocabulary) or >= 1, got 0"),
        ({"top_k": -2}, "top_k: must be -1 (whole vocabulary) or >= 1, got -2"),
    ],
)
def test_from_dict_error_message_names_field_and_rule(given: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError) as excinfo:
        SamplingParams.from_dict(given)
    assert str(excinfo.value) == message


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("max_new_tokens", -1),
        ("temperature", -0.1),
        ("temperature", math.nan),
        ("top_p", 1.01),
        ("top_k", -2),
        ("min_p", 1.1),
        ("frequency_penalty", 2.1),
        ("presence_penalty", -2.1),
        ("repetition_penalty", 0.0),
        ("min_new_tokens", -1),
        ("n", 0),
        ("stop", ""),
        ("stop_token_ids", [-1]),
        ("logit_bias", {"-1": 1.0}),
        ("logit_bias", {1: math.nan}),
    ],
)
def test_from_dict_rejects_out_of_range_naming_field(field: str, value: object) -> None:
    """Ranges are checked when parsing too: a request is never half-validated."""
    with pytest.raises(ValueError) as excinfo:
        SamplingParams.from_dict({field: value})
    assert str(excinfo.value).startswith(f"{field}: ")


def test_from_dict_checks_min_against_max_new_tokens() -> None:
    with pytest.raises(ValueError, match=r"^min_new_tokens: must be <= max_new_tokens \(4\)"):
        SamplingParams.from_dict({"max_new_tokens": 4, "min_new_tokens": 5})


@pytest.mark.parametrize("given", [[1, 2], "temperature", 3])
def test_from_dict_rejects_a_non_object(given: Any) -> None:
    with pytest.raises(ValueError, match=r"^sampling_params: expected an object"):
        SamplingParams.from_dict(given)


def test_from_dict_accepts_tuples_for_lists() -> None:
    params = SamplingParams.from_dict({"stop": ("a", "b"), "stop_token_ids": (1, 2)})
    assert (params.stop, params.stop_token_ids) == (["a", "b"], [1, 2])


def test_from_dict_leaves_the_vocabulary_bound_to_verify() -> None:
    params = SamplingParams.from_dict({"stop_token_ids": [50]})
    with pytest.raises(ValueError, match=r"^stop_token_ids: must be in \[0, 50\)"):
        params.verify(vocab_size=50)
