"""Tool calling on /v1/chat/completions: tool-call formats (SGLang's parser names), streaming
detection of calls in the answer, and the plan of a request's tools (template, forcing
grammar, parser).

Re-exports the public names of `tool_plan` and `detector`.
"""

from __future__ import annotations

from .detector import JsonToolDetector, ParseResult, ToolCallDelta
from .pythonic import PythonicDetector
from .tool_plan import (
    NO_TOOLS,
    Detector,
    ToolPlan,
    ToolSpec,
    plan_tools,
    tool_finish,
    with_tool_constraint,
)

__all__ = [
    "NO_TOOLS",
    "Detector",
    "JsonToolDetector",
    "ParseResult",
    "PythonicDetector",
    "ToolCallDelta",
    "ToolPlan",
    "ToolSpec",
    "plan_tools",
    "tool_finish",
    "with_tool_constraint",
]
