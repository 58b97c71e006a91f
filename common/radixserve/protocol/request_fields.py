"""Reading the raw fields of request bodies that the engine and the router both read (token ids,
chat messages), so the router tokenizes exactly what the engine will. No state, no torch.

Every failure is a ValueError whose message starts with the field at fault
("messages.2.content: ..."); each server turns it into its own 400.
"""

from __future__ import annotations

import json
from typing import Any


def is_token_id(x: object) -> bool:
    """An int that is not a bool (JSON's `true` arrives as Python's True, an int subclass)."""
    return isinstance(x, int) and not isinstance(x, bool)


def message_dicts(messages: Any) -> list[dict[str, Any]]:
    """OpenAI messages as the chat template receives them: role, content (parts joined by
    newlines, None as ""), and name, tool_calls, tool_call_id when given; other keys are
    dropped."""
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
    if message.get("tool_calls") is not None:
        out["tool_calls"] = _tool_calls(i, message["tool_calls"])
    call_id = message.get("tool_call_id")
    if call_id is not None:
        if not isinstance(call_id, str):
            raise ValueError(f"messages.{i}.tool_call_id: expected a string")
        out["tool_call_id"] = call_id
    return out


def _tool_calls(i: int, calls: Any) -> list[dict[str, Any]]:
    """An assistant's calls as templates read them: `function.arguments` as an object (the
    API carries it as JSON text; Hermes / Qwen / Llama templates call `tojson` on it)."""
    if not isinstance(calls, list):
        raise ValueError(f"messages.{i}.tool_calls: expected a list")
    out = []
    for j, call in enumerate(calls):
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise ValueError(f"messages.{i}.tool_calls.{j}.function: needs a name")
        args = fn.get("arguments", "{}")
        if isinstance(args, str):
            try:
                args = json.loads(args) if args.strip() else {}
            except ValueError:
                raise ValueError(
                    f"messages.{i}.tool_calls.{j}.function.arguments: not valid JSON"
                ) from None
        out.append({**call, "function": {**fn, "arguments": args}})
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


def template_tools(tools: Any, tool_choice: Any) -> list[dict[str, Any]] | None:
    """The tools a chat template receives (engine and router alike, so the router's routing key
    is the engine's prompt): none with `tool_choice` "none", only the named one for a named
    choice, else all, each as `{"type": "function", "function": {...}}`."""
    if not isinstance(tools, list) or not tools or tool_choice == "none":
        return None
    named = None
    if isinstance(tool_choice, dict) and isinstance(tool_choice.get("function"), dict):
        named = tool_choice["function"].get("name")
    out = []
    for i, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(fn, dict):
            raise ValueError(f"tools.{i}.function: expected an object")
        if named is None or fn.get("name") == named:
            out.append({"type": "function", "function": fn})
    return out or None
