"""The request-body parser of the engine and the router: NaN, Infinity and numbers beyond the
float range (which Python's `json` reads) are refused naming their path; well-formed bodies,
malformed JSON and other JSON types as before."""

from __future__ import annotations

import json

import pytest

from radixserve.protocol.json_body import BodyError, parse_json_object

CASES = [
    (b'{"temperature": NaN}', "temperature", "NaN"),
    (b'{"sampling_params": {"max_new_tokens": 4, "top_p": Infinity}}', "sampling_params.top_p",
     "Infinity"),
    (b'{"messages": [{"role": "user", "content": -Infinity}]}', "messages[0].content",
     "-Infinity"),
    (b'{"logit_bias": {"42": 1e999}}', "logit_bias.42", "1e999"),
    (b'{"input_ids": [[1, 2], [3, -1E400]]}', "input_ids[1][1]", "-1E400"),
    (b'{"my key": [NaN]}', 'body["my key"][0]', "NaN"),
    (b'{"a": 1.5, "b": {"c": NaN}, "d": Infinity}', "b.c", "NaN"),  # the first one is named
]  # fmt: skip


@pytest.mark.parametrize(("raw", "field", "literal"), CASES)
def test_a_non_finite_number_is_refused_naming_its_path(
    raw: bytes, field: str, literal: str
) -> None:
    with pytest.raises(BodyError) as info:
        parse_json_object(raw)
    assert info.value.field == field
    assert str(info.value) == f"{field}: expected a finite number, got {literal} (not valid JSON)"


def test_well_formed_bodies_parse_as_json_does() -> None:
    body = {
        "text": "NaN Infinity",
        "sampling_params": {"temperature": 0.5, "top_k": -1},
        "x": 1e308,
    }
    raw = json.dumps(body).encode()
    assert parse_json_object(raw) == json.loads(raw) == body


def test_a_repeated_key_that_replaced_the_nan_leaves_a_valid_body() -> None:
    assert parse_json_object(b'{"top_p": NaN, "top_p": 0.5}') == {"top_p": 0.5}


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b'{"prompt": ', "malformed JSON"),
        (b"\xff", "malformed JSON"),
        (b"[NaN]", "expected a JSON object"),
        (b'"text"', "expected a JSON object"),
        (b"[" * 100_000 + b"]" * 100_000, "JSON nested too deeply"),
    ],
)
def test_other_bad_bodies_blame_the_body(raw: bytes, reason: str) -> None:
    with pytest.raises(BodyError, match=f"^body: {reason}") as info:
        parse_json_object(raw)
    assert info.value.field == "body"


def test_a_key_outside_ascii_words_is_quoted_in_the_path() -> None:
    with pytest.raises(BodyError) as info:
        parse_json_object('{"\u023a": {"top_k": NaN}}'.encode())
    assert info.value.field == 'body["\\u023a"].top_k'
