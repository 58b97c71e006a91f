"""Tool-call and reasoning parsing, without a server: each SGLang format's answer parsed whole
equals the same answer streamed in pieces of every size, calls of undeclared tools are dropped,
text around the calls stays content, and `<think>` splits as the reasoning parsers define."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from radixserve.engine.entrypoints.chat_output import ChatOutputConfig, ChoiceOutput
from radixserve.engine.entrypoints.function_call import plan_tools
from radixserve.engine.entrypoints.reasoning import (
    starts_in_reasoning,
    template_thinks_by_default,
    thinks_first,
)

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}},
    {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}},
]
PARIS = ("get_weather", {"city": 'Paris, "FR" {x}', "days": [1, {"a": 2}]})
UTC = ("get_time", {"tz": "UTC"})

CASES = [
    ("hermes", 'Sure! <tool_call>{"name": "get_weather", "arguments": {"city": "Paris, \\"FR\\" '
     '{x}", "days": [1, {"a": 2}]}}</tool_call>\n<tool_call>{"name": "nope", "arguments": {}}'
     '</tool_call><tool_call>{"arguments": {"tz": "UTC"}, "name": "get_time"}</tool_call>',
     "Sure! ", [PARIS, UTC]),
    ("qwen25", '<tool_call>\n{"name": "get_time", "arguments": {"tz": "UTC"}}\n</tool_call>', "",
     [UTC]),
    ("llama3", '{"name": "get_time", "parameters": {"tz": "UTC"}}; {"name": "get_weather", '
     '"parameters": {"city": "Paris, \\"FR\\" {x}", "days": [1, {"a": 2}]}}', "", [UTC, PARIS]),
    ("llama3", 'It is {"name": "get_time"} o\'clock', 'It is {"name": "get_time"} o\'clock', []),
    ("mistral", '[TOOL_CALLS] [{"name": "get_time", "arguments": {"tz": "UTC"}}]', "", [UTC]),
    ("pythonic", 'Calling [get_time(tz="UTC"), get_weather(city=\'Paris, "FR" {x}\', '
     "days=[1, {'a': 2}])]", "Calling ", [UTC, PARIS]),
    ("pythonic", "a list [1, 2] is not a call", "a list [1, 2] is not a call", []),
    ("hermes", "no calls, and a lone <tool", "no calls, and a lone <tool", []),
]  # fmt: skip


def _run(config: ChatOutputConfig, text: str, size: int) -> tuple[dict[str, Any], str]:
    """(non-stream message, streamed message rebuilt from the deltas of `size`-char pieces)."""
    whole = ChoiceOutput(config).message(text)
    parser = ChoiceOutput(config)
    deltas = []
    pieces = [text[i : i + size] for i in range(0, len(text), size)] or [""]
    for k, piece in enumerate(pieces):
        deltas += parser.deltas(piece, final=k == len(pieces) - 1)
    content = "".join(d.get("content", "") for d in deltas)
    calls: dict[int, list[str]] = {}
    for d in deltas:
        for c in d.get("tool_calls", []):
            entry = calls.setdefault(c["index"], ["", ""])
            entry[0] += c["function"].get("name") or ""
            entry[1] += c["function"]["arguments"]
    rebuilt = [(n, json.loads(a)) for n, a in (calls[i] for i in sorted(calls))]
    return whole, f"{content}|{json.dumps(rebuilt)}"


@pytest.mark.parametrize(("parser", "text", "content", "calls"), CASES)
def test_whole_and_streamed_answers_agree(
    parser: str, text: str, content: str, calls: list[tuple[str, Any]]
) -> None:
    config = ChatOutputConfig(plan_tools(TOOLS, "auto", True, parser), None)
    for size in (1, 2, 3, 7, 1000):
        whole, streamed = _run(config, text, size)
        got = [(c["function"]["name"], json.loads(c["function"]["arguments"]))
               for c in whole.get("tool_calls", [])]  # fmt: skip
        assert got == calls
        assert (whole["content"] or "") == content
        assert streamed == f"{content}|{json.dumps(calls)}"


@pytest.mark.parametrize(
    ("parser", "text", "reasoning", "content"),
    [
        ("deepseek-r1", "step one, two</think>\n\nThe answer is 4.", "step one, two",
         "\n\nThe answer is 4."),
        ("deepseek-r1", "<think>x</think>y", "x", "y"),
        ("deepseek-r1", "cut short <thi", "cut short <thi", ""),
        ("qwen3", "<think>\nhmm</think>\n\nyes", "\nhmm", "\n\nyes"),  # as written (SGLang)
        ("qwen3", "no thinking here", None, "no thinking here"),
        ("qwen3-thinking", "deep</think>done", "deep", "done"),
    ],
)  # fmt: skip
def test_reasoning_split(parser: str, text: str, reasoning: str | None, content: str) -> None:
    config = ChatOutputConfig(plan_tools(None, None, True, None), starts_in_reasoning(parser))
    for size in (1, 2, 5, 1000):
        whole, streamed = _run(config, text, size)
        assert (whole["reasoning_content"], whole["content"]) == (reasoning, content)
        assert streamed == f"{content}|[]"


def test_reasoning_then_a_tool_call() -> None:
    config = ChatOutputConfig(plan_tools(TOOLS, "auto", True, "qwen25"), True)
    text = (
        'plan it</think><tool_call>\n{"name": "get_time", "arguments": {"tz": "UTC"}}\n</tool_call>'
    )
    msg = ChoiceOutput(config).message(text)
    assert msg["reasoning_content"] == "plan it" and msg["content"] is None
    assert msg["tool_calls"][0]["function"] == {"name": "get_time", "arguments": '{"tz": "UTC"}'}


def test_forced_calls_without_a_parser_use_the_json_array() -> None:
    plan = plan_tools(TOOLS, {"type": "function", "function": {"name": "get_time"}}, False, None)
    schema = json.loads(plan.params["json_schema"])
    assert schema["maxItems"] == 1 and schema["minItems"] == 1
    assert plan.template_tools == [TOOLS[1]]  # a named choice shows the template that tool only
    msg = ChoiceOutput(ChatOutputConfig(plan, None)).message(
        '[{"name": "get_time", "parameters": {"tz": "UTC"}}]'
    )
    assert [c["function"]["name"] for c in msg["tool_calls"]] == ["get_time"]


# Templates beside Qwen3's real one: no thinking switch, and a switch that is off by default.
NO_SWITCH = "{% for m in messages %}{{ m.content }}{% endfor %}{{ '<|im_start|>assistant\\n' }}"
OPT_IN = NO_SWITCH + "{% if enable_thinking is defined and enable_thinking %}<think>{% endif %}"


def test_qwen3_template_thinks_by_default(qwen3_tokenizer_dir: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(qwen3_tokenizer_dir))
    assert template_thinks_by_default(tokenizer)
    for template in (NO_SWITCH, OPT_IN):
        tokenizer.chat_template = template
        assert not template_thinks_by_default(tokenizer)


@pytest.mark.parametrize(
    ("parser", "kwargs", "by_default", "thinks"),
    [
        ("qwen3", None, True, True),
        ("qwen3", {"enable_thinking": False}, True, False),
        ("qwen3", None, False, False),  # a template without the switch: not taken to think
        ("qwen3", {"enable_thinking": True}, False, True),
        ("deepseek-r1", {"enable_thinking": False}, False, True),
        ("qwen3-thinking", None, False, True),
    ],
)
def test_a_grammar_waits_for_the_reasoning(
    parser: str, kwargs: dict[str, Any] | None, by_default: bool, thinks: bool
) -> None:
    assert thinks_first(parser, kwargs, by_default) is thinks
