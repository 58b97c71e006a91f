"""`--reasoning-parser`: the answer's `<think>…</think>` part as `reasoning_content`, the rest
as `content`, streamed too (SGLang's detectors by name):

- deepseek-r1: the answer always starts in reasoning (R1 often leaves out the opening tag);
  everything before `</think>` is reasoning;
- qwen3: reasoning when the answer opens with `<think>` (the hybrid models write it when
  thinking is on, their template's default; with `chat_template_kwargs.enable_thinking` false
  the template closes the block itself and the answer is all content);
- qwen3-thinking: always reasoning.

An answer cut before `</think>` is all reasoning. Both parts are kept as written, the blank
lines after `</think>` included (SGLang 0.5.23's detectors and vLLM's parsers do the same).
Text that may be the start of a tag is held back. Main process.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

START, END = "<think>", "</think>"


@dataclass(frozen=True, slots=True)
class ReasoningSplit:
    reasoning: str = ""
    content: str = ""


def starts_in_reasoning(parser: str) -> bool:
    """Whether an answer is reasoning before any tag (else only after a leading <think>)."""
    return parser != "qwen3"


def thinks_first(
    parser: str, template_kwargs: dict[str, Any] | None, thinks_by_default: bool = False
) -> bool:
    """Whether the answer surely opens with reasoning, so that a grammar (response_format, a
    forced tool call) must constrain only what follows "</think>": deepseek-r1 and
    qwen3-thinking always; qwen3 when thinking is on for the request:
    `chat_template_kwargs.enable_thinking` true, or left out where the chat template thinks by
    default (`thinks_by_default`, Qwen3's hybrid template; SGLang reads it from the template
    too). A template without that switch is not taken to think, as a model that never thinks
    would otherwise never be constrained."""
    if parser == "qwen3":
        enable = (template_kwargs or {}).get("enable_thinking")
        return thinks_by_default if enable is None else enable is True
    return True


def template_thinks_by_default(tokenizer: Any) -> bool:
    """Whether the chat template has an `enable_thinking` switch that is on when left out: its
    generation prompt without the switch is the one with it true, and not the one with it
    false (where Qwen3's template writes an empty think block, so the model does not think)."""
    probe = [{"role": "user", "content": "hi"}]

    def render(**kwargs: Any) -> Any:
        return tokenizer.apply_chat_template(
            probe, tokenize=False, add_generation_prompt=True, **kwargs
        )

    try:
        default, on, off = render(), render(enable_thinking=True), render(enable_thinking=False)
    except Exception:  # a template that cannot render the probe: no switch we can read
        return False
    return bool(default == on != off)


class ReasoningDetector:
    def __init__(self, in_reasoning: bool) -> None:
        self.in_reasoning = in_reasoning
        self.at_start = True  # nothing emitted yet: an opening tag may still come
        self.buffer = ""

    def feed(self, text: str) -> ReasoningSplit:
        self.buffer += text
        if self.at_start:
            head = self.buffer.lstrip()
            if START.startswith(head) and len(head) < len(START):
                return ReasoningSplit()  # maybe the opening tag: wait
            self.at_start = False
            if head.startswith(START):
                self.in_reasoning, self.buffer = True, head[len(START) :]
        if self.in_reasoning:
            return self._reasoning()
        return ReasoningSplit(content=self._content())

    def finish(self) -> ReasoningSplit:
        text, self.buffer = self.buffer, ""
        if self.in_reasoning:
            return ReasoningSplit(reasoning=text)
        return ReasoningSplit(content=text)

    def _reasoning(self) -> ReasoningSplit:
        at = self.buffer.find(END)
        if at >= 0:
            reasoning, self.buffer = self.buffer[:at], self.buffer[at + len(END) :]
            self.in_reasoning = False
            return ReasoningSplit(reasoning, self._content())
        keep = _partial_suffix(self.buffer, END)
        cut = len(self.buffer) - keep
        reasoning, self.buffer = self.buffer[:cut], self.buffer[cut:]
        return ReasoningSplit(reasoning=reasoning)

    def _content(self) -> str:
        text, self.buffer = self.buffer, ""
        return text


def _partial_suffix(text: str, token: str) -> int:
    for n in range(min(len(text), len(token) - 1), 0, -1):
        if token.startswith(text[-n:]):
            return n
    return 0
