"""Reasoning output of a model whose chat template thinks: a tiny random Qwen3 with the real Qwen3
tokenizer and chat template, planted to write `<think>Okay, the user says hi.\\n</think>\\n\\n
Hello! How can I help?<|im_end|>` (thinking_qwen3.py), served with `--reasoning-parser qwen3`
(and `deepseek-r1`) and read back by the official `openai` client: the split, whole and
streamed; the raw answer; `enable_thinking: false` reaching the template; grammars (a regex, a
JSON schema) that constrain the content after `</think>` and leave the reasoning alone.

The oracles: transformers' greedy `generate` on the same weights (the ids our engine must
write), the tokenizer's own decoding of those ids (what reasoning_content and content hold) and
its own rendering of the chat template (what `chat_template_kwargs` must reach).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from tests.engine.server.live_server import LiveServer, live_server
from tests.engine.server.thinking_qwen3 import ANSWER, REASONING, save_thinking_qwen3

ASK: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Hi there"}]
NO_THINKING = {"chat_template_kwargs": {"enable_thinking": False}}
THINKING = {"chat_template_kwargs": {"enable_thinking": True}}
BYE = "Bye[.]"  # a regex the planted answer ("Hello! …") does not match
GREETING = {
    "type": "object",
    "properties": {"greeting": {"enum": ["hi", "bye"]}},
    "required": ["greeting"],
    "additionalProperties": False,
}


@dataclass(frozen=True)
class Thinker:
    folder: Path
    tokenizer: Any
    chain: list[int]  # what greedy decoding writes after the generation prompt

    def decode(self, ids: list[int]) -> str:
        return str(self.tokenizer.decode(ids))

    @property
    def reasoning(self) -> str:
        """The text between <think> and </think>, as the tokenizer decodes the chain."""
        start, end = self.tags()
        return self.decode(self.chain[start + 1 : end])

    @property
    def after(self) -> str:
        """The text after </think>, up to <|im_end|> (left out of the answer as EOS)."""
        _, end = self.tags()
        return self.decode(self.chain[end + 1 : -1])

    def tags(self) -> tuple[int, int]:
        """Where <think> and </think> are in the chain."""
        ids = self.tokenizer.convert_tokens_to_ids(["<think>", "</think>"])
        return self.chain.index(ids[0]), self.chain.index(ids[1])


@pytest.fixture(scope="module")
def thinker(tmp_path_factory: pytest.TempPathFactory, qwen3_tokenizer_dir: Path) -> Thinker:
    from transformers import AutoTokenizer

    folder = tmp_path_factory.mktemp("thinking-qwen3")
    chain = save_thinking_qwen3(folder, qwen3_tokenizer_dir)
    return Thinker(folder, AutoTokenizer.from_pretrained(str(folder)), chain)


# Compact JSON: with free whitespace allowed, a random model under a schema may write whitespace
# until max_tokens (its planted logits say nothing about JSON).
SERVER_ARGS = ("--max-total-tokens", "4096", "--constrained-json-disable-any-whitespace")
PARSERS = ("qwen3", "deepseek-r1")


@pytest.fixture(scope="module")
def servers(thinker: Thinker) -> Iterator[dict[str, LiveServer]]:
    """One server per parser on the same checkpoint, started side by side (start-up is most
    of this module's time)."""
    with ExitStack() as stack:
        with ThreadPoolExecutor(len(PARSERS)) as pool:
            started = {
                parser: pool.submit(stack.enter_context, _serve(thinker, parser))
                for parser in PARSERS
            }
        yield {parser: future.result() for parser, future in started.items()}


def _serve(thinker: Thinker, parser: str) -> AbstractContextManager[LiveServer]:
    args = ("--reasoning-parser", parser, *SERVER_ARGS)
    return live_server(*args, model_path=str(thinker.folder))


@pytest.fixture(scope="module")
def server(servers: dict[str, LiveServer]) -> LiveServer:
    return servers["qwen3"]


def _client(server: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="x", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def client(server: LiveServer) -> openai.OpenAI:
    return _client(server)


@pytest.fixture(scope="module")
def r1_client(servers: dict[str, LiveServer]) -> openai.OpenAI:
    return _client(servers["deepseek-r1"])


def _create(client: openai.OpenAI, extra: dict[str, Any] | None = None, **kw: Any) -> Any:
    model = client.models.list().data[0].id
    return client.chat.completions.create(
        model=model, messages=ASK, max_tokens=48, temperature=0, extra_body=extra or {}, **kw
    )


def _message(client: openai.OpenAI, extra: dict[str, Any] | None = None) -> tuple[Any, str]:
    """(reasoning_content, content) of the whole answer."""
    msg = _create(client, extra).choices[0].message
    return msg.model_extra.get("reasoning_content"), msg.content


def _streamed(client: openai.OpenAI, extra: dict[str, Any] | None = None) -> tuple[str, str]:
    """The concatenated reasoning_content and content deltas."""
    reasoning, content = "", ""
    for chunk in _create(client, extra, stream=True):
        delta = chunk.choices[0].delta if chunk.choices else None
        if delta is not None:
            reasoning += (delta.model_extra or {}).get("reasoning_content") or ""
            content += delta.content or ""
    return reasoning, content


def _template_ids(thinker: Thinker, **kwargs: Any) -> list[int]:
    text = thinker.tokenizer.apply_chat_template(
        ASK, tokenize=False, add_generation_prompt=True, **kwargs
    )
    return list(thinker.tokenizer.encode(text, add_special_tokens=False))


def _served_ids(server: LiveServer, prompt: list[int]) -> list[int]:
    body = {"input_ids": prompt, "sampling_params": {"temperature": 0, "max_new_tokens": 48}}
    out = httpx.post(server.base_url + "/generate", json=body, timeout=120).json()
    return list(out["output_ids"])


def test_engine_writes_what_transformers_writes(thinker: Thinker, server: LiveServer) -> None:
    """Greedy ids after the templated prompt, thinking and not: transformers' (the oracle) are
    the planted chain, or its answer alone after the template's empty think block, and ours
    are the same."""
    import torch
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(str(thinker.folder), dtype=torch.float32).eval()
    _, end = thinker.tags()
    answer = thinker.chain[end + 2 :]  # after "</think>" "\n\n"
    for kwargs, expected in (({}, thinker.chain), ({"enable_thinking": False}, answer)):
        prompt = _template_ids(thinker, **kwargs)
        oracle = hf.generate(torch.tensor([prompt]), max_new_tokens=48, do_sample=False)
        assert oracle[0, len(prompt) :].tolist() == expected
        assert _served_ids(server, prompt) == expected


def test_chain_is_the_planted_text(thinker: Thinker) -> None:
    assert (thinker.reasoning, thinker.after.lstrip()) == (REASONING, ANSWER)


def test_reasoning_content_is_split_out(thinker: Thinker, client: openai.OpenAI) -> None:
    """reasoning_content: the text between the tags as it is; content: what follows
    </think> as it is, its blank lines included (SGLang 0.5.23's qwen3 detector)."""
    expected = (thinker.reasoning, thinker.after)
    assert _message(client) == expected
    assert _streamed(client) == expected


def test_separate_reasoning_false_keeps_the_raw_answer(
    thinker: Thinker, client: openai.OpenAI
) -> None:
    raw = thinker.decode(thinker.chain[:-1])
    assert raw.startswith("<think>") and "</think>" in raw
    assert _message(client, {"separate_reasoning": False}) == (None, raw)
    assert _streamed(client, {"separate_reasoning": False}) == ("", raw)


def test_enable_thinking_false_reaches_the_template(
    thinker: Thinker, server: LiveServer, client: openai.OpenAI
) -> None:
    """The real template closes an empty think block itself: the prompt ends with
    `<think>\\n\\n</think>\\n\\n` and the model's answer is all content."""
    body = {"messages": ASK, **NO_THINKING}
    served = httpx.post(server.base_url + "/tokenize", json=body, timeout=30).json()["tokens"]
    assert served == _template_ids(thinker, enable_thinking=False)
    assert thinker.decode(served).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    default = _template_ids(thinker)
    assert served[: len(default)] == default and len(served) == len(default) + 4
    out = _create(client, NO_THINKING)
    assert out.usage.prompt_tokens == len(served)
    msg = out.choices[0].message
    assert (msg.model_extra.get("reasoning_content"), msg.content) == (None, ANSWER)
    assert _streamed(client, NO_THINKING) == ("", ANSWER)


def test_grammar_applies_after_the_reasoning(thinker: Thinker, client: openai.OpenAI) -> None:
    """The regex `Bye[.]` allows neither `<think>` nor the planted "Hello! …" answer. Qwen3's
    template thinks unless `enable_thinking` is false, so the grammar waits for </think>: the
    reasoning is the planted one, unconstrained, and the content is "Bye." where the model
    wanted "Hello! …". With thinking off the template closes the think block itself and the
    same regex applies from the first token: no reasoning at all."""
    regex = {"regex": BYE}
    for thinking in ({}, THINKING):
        assert _message(client, {**regex, **thinking}) == (thinker.reasoning, "Bye.")
    assert _streamed(client, regex) == (thinker.reasoning, "Bye.")
    assert _message(client, {**regex, **NO_THINKING}) == (None, "Bye.")


def test_response_format_applies_after_the_reasoning(
    thinker: Thinker, client: openai.OpenAI
) -> None:
    schema = {"type": "json_schema", "json_schema": {"name": "greeting", "schema": GREETING}}
    msg = _create(client, response_format=schema).choices[0].message
    assert msg.model_extra.get("reasoning_content") == thinker.reasoning
    jsonschema.validate(json.loads(msg.content), GREETING)


def test_deepseek_r1_starts_in_reasoning(thinker: Thinker, r1_client: openai.OpenAI) -> None:
    """deepseek-r1 takes the answer for reasoning from its first token, `<think>` or not: the
    planted chain splits as with qwen3; the answer after the template's own empty think block
    (no `</think>` of its own) is all reasoning; and a grammar waits for `</think>`."""
    expected = (thinker.reasoning, thinker.after)
    assert _message(r1_client) == expected
    assert _streamed(r1_client) == expected
    assert _message(r1_client, NO_THINKING) == (ANSWER, "")
    assert _streamed(r1_client, NO_THINKING) == (ANSWER, "")
    assert _message(r1_client, {"regex": BYE}) == (thinker.reasoning, "Bye.")
