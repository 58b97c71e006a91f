"""The request fields both servers read alike: token ids (a bool is not one) and chat messages
as the template receives them."""

from __future__ import annotations

from typing import Any

import pytest

from radixserve.protocol.request_fields import is_token_id, message_dicts

ID_CASES = [(0, True), (-3, True), (True, False), (1.0, False), ("1", False), (None, False)]


@pytest.mark.parametrize(("value", "expected"), ID_CASES)
def test_is_token_id_takes_ints_but_not_bools(value: object, expected: bool) -> None:
    assert is_token_id(value) is expected


def test_message_dicts_flattens_parts_and_drops_other_keys() -> None:
    messages = [
        {"role": "system", "content": None, "extra": 1},
        {"role": "user", "name": "ann", "content": [{"type": "text", "text": "a"},
                                                    {"type": "text", "text": "b"}]},
    ]  # fmt: skip
    assert message_dicts(messages) == [
        {"role": "system", "content": ""},
        {"role": "user", "content": "a\nb", "name": "ann"},
    ]


@pytest.mark.parametrize(
    ("messages", "field"),
    [
        ([], "messages"),
        ([{"role": 1}], "messages.0.role"),
        ([{"role": "user", "content": [{"type": "image_url"}]}], "messages.0.content"),
        ([{"role": "user", "content": 5}], "messages.0.content"),
    ],
)
def test_message_dicts_names_the_field_at_fault(messages: Any, field: str) -> None:
    with pytest.raises(ValueError, match=rf"^{field}: "):
        message_dicts(messages)
