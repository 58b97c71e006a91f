"""A tenant's rendered chat-template prefix, remembered: for routing, a chat whose head (every
message but the last) the router has seen is rendered as the text before the question, the
question, and the text after it, instead of running the Jinja template again.

Why the text is the template's. The head's text is taken from real renders: the chat is
rendered with each of two stand-ins of different lengths in place of the question, and the
split is kept only if each appears exactly once, the text around them is the same, and
`before + question + after` equals the real render of that first chat. A template could still
treat two questions differently (strip them, or test what they start with); so only questions
that no template logic reads differently take the fast path: plain text with no surrounding
whitespace and no markup (`<`, `{`), sent without a name, tool calls or template options.
Anything else is rendered in full, as before.

Bounded: `MAX_HEADS` heads, least recently used dropped. The router tokenizes on its event
loop and, for large bodies, on worker threads: a lock guards the table.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

from radixserve.router.chat_template import render_chat

MAX_HEADS = 256
# Two stand-ins for the question, of different lengths and letters (private-use characters: no
# tokenizer or template gives them a meaning): a head must render the same around both.
SENTINELS = ("\ue000radixserve-question\ue001", "\ue002q\ue003")
_UNSAFE = ("", "")  # a head whose template does not split cleanly: always rendered in full


class ChatPrefixMemo:
    def __init__(self, max_heads: int = MAX_HEADS) -> None:
        self.max_heads = max_heads
        self._heads: OrderedDict[tuple[Any, ...], tuple[str, str]] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0

    def render(
        self,
        template: str | dict[str, str],
        messages: list[dict[str, Any]],
        special_tokens: dict[str, str],
        template_kwargs: Any,
    ) -> str:
        """`render_chat(template, messages, special_tokens, template_kwargs)`."""
        key = _head_key(template, messages, template_kwargs)
        if key is None:
            return render_chat(template, messages, special_tokens, template_kwargs)
        question: str = messages[-1]["content"]
        with self._lock:
            split = self._heads.get(key)
            if split is not None:
                self._heads.move_to_end(key)
        if split is not None and split is not _UNSAFE:
            self.hits += 1
            return split[0] + question + split[1]
        text = render_chat(template, messages, special_tokens, template_kwargs)
        if split is None:
            self._remember(key, _split(template, messages, special_tokens, question, text))
        return text

    def _remember(self, key: tuple[Any, ...], split: tuple[str, str]) -> None:
        with self._lock:
            self._heads[key] = split
            while len(self._heads) > self.max_heads:
                self._heads.popitem(last=False)


def _head_key(template: Any, messages: list[dict[str, Any]], kwargs: Any) -> tuple[Any, ...] | None:
    """What the head's render depends on, or None when this chat takes no fast path."""
    if kwargs or len(messages) < 2:
        return None
    last = messages[-1]
    if last["role"] != "user" or len(last) != 2 or not _plain(last["content"]):
        return None
    head = []
    for m in messages[:-1]:
        if len(m) != 2 or not isinstance(m["content"], str):
            return None  # a name, tool calls or ids: render in full
        head.append((m["role"], m["content"]))
    which = template if isinstance(template, str) else tuple(sorted(template.items()))
    return (which, tuple(head))


def _plain(question: Any) -> bool:
    return (
        isinstance(question, str)
        and bool(question)
        and question == question.strip()
        and "<" not in question
        and "{" not in question
        and not any(x in question for x in SENTINELS)
    )


def _split(
    template: str | dict[str, str],
    messages: list[dict[str, Any]],
    special_tokens: dict[str, str],
    question: str,
    text: str,
) -> tuple[str, str]:
    """(before, after) of the question in the head's render: the same around both stand-ins
    and around the real question (`text`)."""
    splits = set()
    for sentinel in SENTINELS:
        probe = [*messages[:-1], {"role": "user", "content": sentinel}]
        try:
            rendered = render_chat(template, probe, special_tokens, None)
        except ValueError:
            return _UNSAFE
        if rendered.count(sentinel) != 1:
            return _UNSAFE
        before, after = rendered.split(sentinel)
        splits.add((before, after))
    if len(splits) != 1:
        return _UNSAFE
    (before, after) = splits.pop()
    return (before, after) if before + question + after == text else _UNSAFE
