"""Tool-call formats by SGLang's `--tool-call-parser` names: how a model writes a call, and the
`begin … end` frame the grammar forces for `tool_choice` required or a named function.

JSON formats (one object per call, `name` and `arguments` / `parameters`):
- hermes: `<tool_call>{"name": …, "arguments": {…}}</tool_call>`, repeated;
- qwen25 / qwen: the same with newlines inside the tags;
- llama3: `<|python_tag|>` (optional) then objects separated by `;`;
- mistral: `[TOOL_CALLS] [{…}, {…}]`;
- json_array (no parser, or pythonic, under a forced call): the whole answer is the array
  `[{"name": …, "parameters": {…}}]` that a JSON schema forces (SGLang's fallback).
pythonic (`[f(a=1), g(b="x")]`) is parsed in `pythonic.py`.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class JsonToolFormat:
    name: str
    bot_token: str  # what opens the calls ("" = calls may start right away)
    eot_token: str  # what closes one call or the list ("" = nothing)
    begin: str  # the forced frame's start; {name} is the tool's name
    end: str
    trigger: str
    args_keys: tuple[str, ...] = ("arguments", "parameters")
    bare_start: bool = False  # an answer that starts with '{' is a call (llama3)

    def frame_begin(self, tool: str) -> str:
        return self.begin.replace("{name}", tool)


HERMES = JsonToolFormat(
    "hermes", "<tool_call>", "</tool_call>",
    '<tool_call>{"name": "{name}", "arguments": ', "}</tool_call>", "<tool_call>",
)  # fmt: skip
QWEN25 = JsonToolFormat(
    "qwen25", "<tool_call>", "</tool_call>",
    '<tool_call>\n{"name": "{name}", "arguments": ', "}\n</tool_call>", "<tool_call>",
)  # fmt: skip
LLAMA3 = JsonToolFormat(
    "llama3", "<|python_tag|>", "",
    '<|python_tag|>{"name": "{name}", "parameters": ', "}", "<|python_tag|>", bare_start=True,
)  # fmt: skip
MISTRAL = JsonToolFormat(
    "mistral", "[TOOL_CALLS]", "",
    '[TOOL_CALLS] [{"name": "{name}", "arguments": ', "}]", "[TOOL_CALLS]",
)  # fmt: skip
JSON_ARRAY = JsonToolFormat("json_array", "[", "]", "", "", "", ("parameters", "arguments"))

JSON_FORMATS: dict[str, JsonToolFormat] = {
    "hermes": HERMES,
    "qwen25": QWEN25,
    "qwen": QWEN25,
    "llama3": LLAMA3,
    "mistral": MISTRAL,
}
PYTHONIC = "pythonic"
