"""Reading the raw fields of request bodies that the engine and the router both read (token ids,
chat messages), so the router tokenizes exactly what the engine will. No state, no torch.

Every failure is a ValueError whose message starts with the field at fault
("messages.2.content: ..."); each server turns it into its own 400.
"""

from __future__ import annotations

from typing import Any


def is_token_id(x: object) -> bool:
    """An int that is not a bool (JSON's `true` arrives as Python's True, an int subclass)."""
    return isinstance(x, int) and not isinstance(x, bool)


def message_dicts(messages: Any) -> list[dict[str, Any]]:
    """OpenAI messages as the chat template receives them: role, content (parts joined by
    newlines, None as ""), and name when given; other keys are dropped."""
    if not isinstance(messages, list) or not messages:
        raise ValueError("messages: expected a non-empty list of messages")
    return [_message_dict(i, m) for i, m in enumerate(messages)]


def _message_dict(i: int, message: Any) -> dict[str, Any]:
    if not isinstance(message, dict):
        raise ValueError(f"messages.{i}: expected an object")
    role, name = message.get("role"), message.get("name")
    if not isinstance(role, str):
        raise ValueError(f"messages.{i}.role: expected a string")
    if name is not None and not isinstance(name, str):
        raise ValueError(f"messages.{i}.name: expected a string")
    out: dict[str, Any] = {"role": role, "content": _content(i, message.get("content"))}
    if name is not None:
        out["name"] = name
    return out


def _content(i: int, content: Any) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    if not isinstance(content, list):
        raise ValueError(f"messages.{i}.content: expected a string or a list of parts")
    texts = []
    for part in content:
        if not isinstance(part, dict) or not isinstance(part.get("type"), str):
            raise ValueError(f"messages.{i}.content: each part needs a string 'type'")
        text = part.get("text")
        if text is not None and not isinstance(text, str):
            raise ValueError(f"messages.{i}.content: a part's 'text' must be a string")
        if part["type"] != "text" or text is None:
            raise ValueError(
                f"messages.{i}.content: only text parts are supported, got {part['type']!r}"
            )
        texts.append(text)
    return "\n".join(texts)
