"""OpenAI completions and chat against a live server, through the official `openai` client."""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.engine.server.live_server import LiveServer

MODEL = "smollm2-135m"
PROMPT = "The capital of France is"
CHAT = [{"role": "user", "content": "Say hello."}]


@pytest.fixture(scope="module")
def client(server: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="x", max_retries=0, timeout=60)


def test_models_lists_the_served_name(client: openai.OpenAI) -> None:
    assert [m.id for m in client.models.list().data] == [MODEL]


def test_completion_stream_matches_non_stream(client: openai.OpenAI) -> None:
    plain = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, temperature=0)
    choice = plain.choices[0]
    assert plain.object == "text_completion" and choice.text
    assert choice.finish_reason == "length" and plain.usage.completion_tokens == 8
    assert plain.usage.total_tokens == plain.usage.prompt_tokens + 8
    chunks = list(
        client.completions.create(
            model=MODEL, prompt=PROMPT, max_tokens=8, temperature=0, stream=True
        )
    )
    assert "".join(c.choices[0].text for c in chunks) == choice.text
    assert chunks[-1].choices[0].finish_reason == "length"
    assert all(c.choices[0].finish_reason is None for c in chunks[:-1])


def test_chat_and_chat_stream(client: openai.OpenAI) -> None:
    plain = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=6, temperature=0)
    msg = plain.choices[0].message
    assert plain.object == "chat.completion" and msg.role == "assistant" and msg.content
    stream = client.chat.completions.create(
        model=MODEL, messages=CHAT, max_tokens=6, temperature=0, stream=True
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert text == msg.content
    assert chunks[-1].choices[0].finish_reason == plain.choices[0].finish_reason


def test_content_parts_equal_plain_string(client: openai.OpenAI) -> None:
    parts = [{"role": "user", "content": [{"type": "text", "text": "Say hello."}]}]
    a = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=4, temperature=0)
    b = client.chat.completions.create(model=MODEL, messages=parts, max_tokens=4, temperature=0)
    assert a.choices[0].message.content == b.choices[0].message.content
    assert a.usage.prompt_tokens == b.usage.prompt_tokens


def test_stop_sequence(client: openai.OpenAI) -> None:
    kw = {"model": MODEL, "prompt": "1, 2, 3, 4,", "max_tokens": 16, "temperature": 0}
    r = client.completions.create(stop=[" 7"], **kw)
    choice = r.choices[0]
    assert choice.finish_reason == "stop"
    assert "7" not in choice.text and choice.text.rstrip().endswith("6,")
    assert r.usage.completion_tokens < 16
    chunks = list(client.completions.create(stop=" 7", stream=True, **kw))
    assert "".join(c.choices[0].text for c in chunks) == choice.text
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_n_with_seed_gives_reproducible_choices(client: openai.OpenAI) -> None:
    kw = {"model": MODEL, "max_tokens": 4, "n": 2, "seed": 7, "temperature": 1.0}
    a = client.completions.create(prompt=["Hello", "One two"], **kw)
    assert [c.index for c in a.choices] == [0, 1, 2, 3]
    assert a.usage.prompt_tokens == 3  # "Hello" + "One two", once per prompt, not per sample
    b = client.completions.create(prompt=["Hello", "One two"], **kw)
    assert [c.text for c in a.choices] == [c.text for c in b.choices]
    chat = client.chat.completions.create(messages=CHAT, **{**kw, "max_tokens": 2})
    assert [c.index for c in chat.choices] == [0, 1]


def test_max_tokens_is_length(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(
        model=MODEL, messages=CHAT, max_completion_tokens=3, temperature=0
    )
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 3


def test_completion_logprobs(client: openai.OpenAI) -> None:
    r = client.completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=5, temperature=0, logprobs=3
    )
    lp = r.choices[0].logprobs
    n = r.usage.completion_tokens
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == n
    assert len(lp.text_offset) == n and lp.text_offset[0] == 0
    assert all(v <= 0 for v in lp.token_logprobs)
    assert all(1 <= len(top) <= 3 and all(v <= 0 for v in top.values()) for top in lp.top_logprobs)
    assert "".join(lp.tokens) == r.choices[0].text
    # greedy: the chosen token is the most likely one
    assert all(
        max(top.values()) == pytest.approx(v)
        for top, v in zip(lp.top_logprobs, lp.token_logprobs, strict=True)
    )


def test_completion_echo_logprobs_score_the_prompt(
    client: openai.OpenAI, server: LiveServer
) -> None:
    """lm-eval's loglikelihood request: echo + logprobs gives each prompt token's log-prob
    (None for the first), the same as SGLang's native input_token_logprobs, streamed or not."""
    kw = {"model": MODEL, "prompt": PROMPT, "max_tokens": 1, "temperature": 0, "logprobs": 1}
    r = client.completions.create(echo=True, **kw)
    lp, n = r.choices[0].logprobs, r.usage.prompt_tokens
    assert r.choices[0].text.startswith(PROMPT)
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == n + 1
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert all(v <= 0 for v in lp.token_logprobs[1:])
    assert "".join(lp.tokens) == r.choices[0].text
    assert lp.text_offset[0] == 0 and lp.text_offset[n] == len(PROMPT)
    native = httpx.post(
        server.base_url + "/generate",
        json={
            "text": PROMPT,
            "sampling_params": {"max_new_tokens": 1, "temperature": 0},
            "return_logprob": True,
            "logprob_start_len": 0,
        },
        timeout=60,
    ).json()["meta_info"]
    rows = native["input_token_logprobs"]
    assert [row[0] for row in rows][1:] == pytest.approx(lp.token_logprobs[1:n], abs=1e-4)
    assert rows[0][0] is None and len(rows) == n
    stream = client.completions.create(echo=True, stream=True, **kw)
    streamed = [(t, v) for c in stream if c.choices[0].logprobs for t, v in _pairs(c)]
    assert [t for t, _ in streamed] == lp.tokens
    assert streamed[0][1] is None
    assert [v for _, v in streamed][1:] == pytest.approx(lp.token_logprobs[1:], abs=1e-4)


def _pairs(chunk: object) -> list[tuple[str, float | None]]:
    lp = chunk.choices[0].logprobs  # type: ignore[attr-defined]
    return list(zip(lp.tokens, lp.token_logprobs, strict=True))


def test_chat_logprobs_stream_and_non_stream(client: openai.OpenAI) -> None:
    kw = {"model": MODEL, "messages": CHAT, "max_tokens": 5, "temperature": 0}
    r = client.chat.completions.create(logprobs=True, top_logprobs=2, **kw)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens
    for entry in content:
        assert entry.logprob <= 0 and len(entry.top_logprobs) == 2
        assert entry.bytes == list(entry.token.encode())
        assert all(t.logprob <= 0 for t in entry.top_logprobs)
    stream = client.chat.completions.create(logprobs=True, top_logprobs=2, stream=True, **kw)
    streamed = [
        e
        for c in stream
        if c.choices and c.choices[0].logprobs
        for e in c.choices[0].logprobs.content
    ]
    assert [e.token for e in streamed] == [e.token for e in content]


def test_stream_usage_chunk(client: openai.OpenAI) -> None:
    chunks = list(
        client.completions.create(
            model=MODEL,
            prompt=PROMPT,
            max_tokens=4,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    last = chunks[-1]
    assert last.choices == [] and last.usage.completion_tokens == 4
    assert last.usage.total_tokens == last.usage.prompt_tokens + 4
    assert all(c.usage is None for c in chunks[:-1])


def test_cached_tokens_grow_for_a_repeated_long_prompt(client: openai.OpenAI) -> None:
    prompt = " ".join(f"cache{i}" for i in range(40))  # > 64 tokens, unique to this test
    first = client.completions.create(model=MODEL, prompt=prompt, max_tokens=1, temperature=0)
    second = client.completions.create(model=MODEL, prompt=prompt, max_tokens=1, temperature=0)
    n = first.usage.prompt_tokens
    assert n >= 64
    assert first.usage.prompt_tokens_details.cached_tokens < n - 1
    # the last prompt token is always recomputed (SGLang caps the match at len − 1)
    assert second.usage.prompt_tokens_details.cached_tokens == n - 1


def test_sglang_extras_through_extra_body(client: openai.OpenAI) -> None:
    greedy = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=4, temperature=0)
    top1 = client.completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=4, temperature=1.0, extra_body={"top_k": 1}
    )
    assert top1.choices[0].text == greedy.choices[0].text
    short = [{"role": "user", "content": "Yes or no?"}]  # greedy answer: "No." then EOS
    kw = {"model": MODEL, "messages": short, "max_tokens": 8, "temperature": 0}
    natural = client.chat.completions.create(**kw)
    assert natural.choices[0].finish_reason == "stop"
    ended = natural.usage.completion_tokens
    assert ended < 6
    forced = client.chat.completions.create(extra_body={"ignore_eos": True}, **kw)
    assert forced.choices[0].finish_reason == "length"
    assert forced.usage.completion_tokens == 8
    at_least = client.chat.completions.create(extra_body={"min_tokens": ended + 2}, **kw)
    assert at_least.usage.completion_tokens >= ended + 2
