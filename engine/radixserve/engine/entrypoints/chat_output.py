"""One chat choice's answer text → OpenAI's message fields: `reasoning_content` (with
`--reasoning-parser`), `content` and `tool_calls` (with tools), as whole messages or stream
deltas. The same pieces come out whether the text arrives at once or in any chunks, so a
streamed answer adds up to the non-streamed one. Main process, per choice.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from radixserve.engine.entrypoints.function_call import Detector, ToolCallDelta, ToolPlan
from radixserve.engine.entrypoints.reasoning import ReasoningDetector


@dataclass(frozen=True, slots=True)
class ChatOutputConfig:
    """What every choice of one request parses."""

    tools: ToolPlan
    reasoning_from_start: bool | None  # None: no reasoning split

    @property
    def is_plain(self) -> bool:
        return self.tools.parse_format is None and self.reasoning_from_start is None


class ChoiceOutput:
    def __init__(self, config: ChatOutputConfig) -> None:
        start = config.reasoning_from_start
        self.reasoning = None if start is None else ReasoningDetector(start)
        self.tools: Detector | None = config.tools.detector()
        self.with_reasoning = start is not None
        self.call_ids: dict[int, str] = {}
        self.calls: dict[int, dict[str, Any]] = {}

    @property
    def has_tool_calls(self) -> bool:
        return bool(self.calls)

    def deltas(self, text: str, final: bool = False) -> list[dict[str, Any]]:
        """Stream deltas for the next piece of the answer (`final`: the answer ended)."""
        reasoning, content = text, ""
        if self.reasoning is None:
            reasoning, content = "", text
        else:
            split = self.reasoning.feed(text)
            reasoning, content = split.reasoning, split.content
            if final:
                tail = self.reasoning.finish()
                reasoning, content = reasoning + tail.reasoning, content + tail.content
        calls: list[ToolCallDelta] = []
        if self.tools is not None:
            parsed = self.tools.feed(content)
            content, calls = parsed.normal_text, parsed.calls
            if final:
                content += self.tools.finish().normal_text
        out: list[dict[str, Any]] = []
        if reasoning:
            out.append({"reasoning_content": reasoning})
        if content:
            out.append({"content": content})
        if calls:
            out.append({"tool_calls": [self._call_delta(c) for c in calls]})
        return out

    def message(self, text: str) -> dict[str, Any]:
        """The non-streamed message of the whole answer."""
        fields: dict[str, str] = {"reasoning_content": "", "content": ""}
        for delta in self.deltas(text, final=True):
            for key in ("reasoning_content", "content"):
                fields[key] += delta.get(key, "")
        msg: dict[str, Any] = {"role": "assistant", "content": fields["content"]}
        if self.with_reasoning:
            msg["reasoning_content"] = fields["reasoning_content"] or None
        done = self.tools.num_calls if self.tools is not None else 0
        calls = [self.calls[i] for i in sorted(self.calls) if i < done]  # not one cut short
        if calls:
            msg["tool_calls"] = calls
            msg["content"] = fields["content"] or None
        return msg

    def _call_delta(self, delta: ToolCallDelta) -> dict[str, Any]:
        if delta.name is not None:
            call_id = self.call_ids[delta.index] = f"call_{uuid.uuid4().hex[:24]}"
            self.calls[delta.index] = {
                "id": call_id,
                "type": "function",
                "function": {"name": delta.name, "arguments": ""},
            }
            return {
                "index": delta.index,
                "id": call_id,
                "type": "function",
                "function": {"name": delta.name, "arguments": ""},
            }
        self.calls[delta.index]["function"]["arguments"] += delta.arguments
        return {"index": delta.index, "function": {"arguments": delta.arguments}}
