"""A chat request's tools and `tool_choice` → what the template sees, what the grammar forces
and how the answer is parsed (SGLang's serving_chat rules):

- `none` (the default without tools): no tools in the template, nothing parsed;
- `auto` (the default with tools): the template gets them; the answer is parsed with
  `--tool-call-parser`, unconstrained;
- `required` / a named function: the grammar forces at least one call (exactly one when
  `parallel_tool_calls` is false), its arguments valid under the tool's `parameters` schema.
  JSON formats force the model's own frames and nothing else (an xgrammar structural tag,
  frames separated by newlines; SGLang's triggered tags let free text follow, which a small
  model fills until max_tokens); pythonic, or no
  parser at all, force SGLang's JSON array `[{"name", "parameters"}]` and parse that.

Bad tools or a bad choice raise InvalidRequest naming the field. Main process.
"""

from __future__ import annotations

import copy
import json
import re
from dataclasses import dataclass
from typing import Any

from radixserve.engine.constrained import GrammarKey, grammar_error
from radixserve.engine.entrypoints.request_builder import InvalidRequest
from radixserve.engine.sampling.sampling_params import GRAMMAR_FIELDS
from radixserve.protocol.request_fields import template_tools

from .detector import JsonToolDetector
from .formats import JSON_ARRAY, JSON_FORMATS, PYTHONIC, JsonToolFormat
from .pythonic import PythonicDetector

NAME = re.compile(r"[A-Za-z0-9_.\-]{1,64}")
CHOICES = ("none", "auto", "required")
Detector = JsonToolDetector | PythonicDetector


@dataclass(frozen=True, slots=True)
class ToolSpec:
    name: str
    parameters: dict[str, Any]


@dataclass(frozen=True, slots=True)
class ToolPlan:
    template_tools: list[dict[str, Any]] | None
    params: dict[str, Any]  # sampling parameters to add (the forcing grammar)
    parse_format: JsonToolFormat | str | None  # JSON format, PYTHONIC, or None: no parsing
    tool_names: frozenset[str]

    def detector(self) -> Detector | None:
        if isinstance(self.parse_format, JsonToolFormat):
            return JsonToolDetector(self.parse_format, self.tool_names)
        if self.parse_format == PYTHONIC:
            return PythonicDetector(self.tool_names)
        return None


NO_TOOLS = ToolPlan(None, {}, None, frozenset())


def plan_tools(tools: Any, choice: Any, parallel: bool, parser: str | None) -> ToolPlan:
    specs = parse_tools(tools)
    chosen = parse_tool_choice(choice, specs)
    if chosen == "none" or not specs:
        return NO_TOOLS
    raws = template_tools(tools, choice)
    forced = [s for s in specs if chosen == "required" or s.name == chosen]
    names = frozenset(s.name for s in specs)
    if chosen == "auto":
        fmt = JSON_FORMATS.get(parser or "") or (PYTHONIC if parser == PYTHONIC else None)
        return ToolPlan(raws, {}, fmt, names)
    fmt = JSON_FORMATS.get(parser or "")
    if fmt is not None:
        return ToolPlan(
            raws, {"structural_tag": _structural_tag(fmt, forced, parallel)}, fmt, names
        )
    return ToolPlan(raws, {"json_schema": _array_schema(forced, parallel)}, JSON_ARRAY, names)


def parse_tools(tools: Any) -> list[ToolSpec]:
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise InvalidRequest("tools: expected a list of tools")
    specs = [_tool(i, t) for i, t in enumerate(tools)]
    seen: set[str] = set()
    for i, spec in enumerate(specs):
        if spec.name in seen:
            raise InvalidRequest(f"tools.{i}.function.name: duplicate tool name {spec.name!r}")
        seen.add(spec.name)
    return specs


def _tool(i: int, tool: Any) -> ToolSpec:
    where = f"tools.{i}"
    if not isinstance(tool, dict) or tool.get("type", "function") != "function":
        raise InvalidRequest(f"{where}: expected {{'type': 'function', 'function': {{...}}}}")
    fn = tool.get("function")
    if not isinstance(fn, dict):
        raise InvalidRequest(f"{where}.function: expected an object")
    name = fn.get("name")
    if not isinstance(name, str) or NAME.fullmatch(name) is None:
        raise InvalidRequest(f"{where}.function.name: must be 1-64 of a-z, A-Z, 0-9, _ . -")
    params = fn.get("parameters", {"type": "object", "properties": {}})
    if not isinstance(params, dict):
        raise InvalidRequest(f"{where}.function.parameters: expected a JSON schema object")
    error = grammar_error(GrammarKey("json", json.dumps(params)))
    if error is not None:
        raise InvalidRequest(f"{where}.function.parameters: {error}")
    return ToolSpec(name, params)


def parse_tool_choice(choice: Any, tools: list[ToolSpec]) -> str:
    """ "none", "auto", "required", or the name of the function to call."""
    if choice is None:
        return "auto" if tools else "none"
    if isinstance(choice, str):
        if choice not in CHOICES:
            raise InvalidRequest(f"tool_choice: must be one of {', '.join(CHOICES)} or a function")
        if choice != "none" and not tools:
            raise InvalidRequest(f"tool_choice: {choice!r} needs tools")
        return choice
    fn = choice.get("function") if isinstance(choice, dict) else None
    name = fn.get("name") if isinstance(fn, dict) else None
    if not isinstance(name, str):
        raise InvalidRequest("tool_choice: expected {'type': 'function', 'function': {'name'}}")
    if name not in {t.name for t in tools}:
        raise InvalidRequest(f"tool_choice.function.name: no tool named {name!r}")
    return name


def _structural_tag(fmt: JsonToolFormat, tools: list[ToolSpec], parallel: bool) -> str:
    """xgrammar's structural tag: one or more of the tools' frames (exactly one without
    parallel calls), newline-separated, and nothing else: the answer is the calls."""
    tags = [
        {
            "type": "tag",
            "begin": fmt.frame_begin(t.name),
            "content": {"type": "json_schema", "json_schema": t.parameters},
            "end": fmt.end,
        }
        for t in tools
    ]
    tag = {
        "type": "tags_with_separator",
        "tags": tags,
        "separator": "\n",
        "at_least_one": True,
        "stop_after_first": not parallel,
    }
    return json.dumps({"type": "structural_tag", "format": tag})


def _array_schema(tools: list[ToolSpec], parallel: bool) -> str:
    """SGLang's forced-call schema: a non-empty array of {name, parameters}; each tool's
    `$defs` hoisted to the root, where its `#/$defs/…` references then resolve."""
    defs: dict[str, Any] = {}
    items = []
    for t in tools:
        params = copy.deepcopy(t.parameters)
        defs.update(params.pop("$defs", {}))
        items.append(
            {
                "type": "object",
                "properties": {"name": {"const": t.name}, "parameters": params},
                "required": ["name", "parameters"],
            }
        )
    schema: dict[str, Any] = {"type": "array", "minItems": 1, "items": {"anyOf": items}}
    if not parallel:
        schema["maxItems"] = 1
    if defs:
        schema["$defs"] = defs
    return json.dumps(schema)


def with_tool_constraint(params: dict[str, Any], plan: ToolPlan) -> dict[str, Any]:
    """The request's sampling parameters with the grammar that forces a tool call (SGLang: a
    400 with another constraint); tool markup survives detokenization when tools are parsed."""
    if plan.params:
        clash = [g for g in GRAMMAR_FIELDS if params.get(g) is not None]
        if clash:
            raise InvalidRequest(
                f"tool_choice: a required or named tool call cannot be combined with {clash[0]}"
                " (or response_format)"
            )
    if plan.parse_format is not None:
        params = {**params, "skip_special_tokens": False}
    return {**params, **plan.params}


def tool_finish(reason: str | None, has_tool_calls: bool) -> str | None:
    """OpenAI's finish_reason "tool_calls" for an answer that ended on calls."""
    return "tool_calls" if reason == "stop" and has_tool_calls else reason
