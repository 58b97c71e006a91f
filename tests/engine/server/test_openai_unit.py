"""OpenAI routes over a scripted TokenizerManager (no model): engine aborts, chat BOS handling,
usage accounting and prompt parsing."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from radixserve.engine.entrypoints.http_errors import install_error_handlers
from radixserve.engine.entrypoints.openai_protocol import prompt_list, rename_error, usage
from radixserve.engine.entrypoints.openai_serving import install_openai_routes
from radixserve.engine.entrypoints.request_builder import InvalidRequest, ServerLimits
from radixserve.engine.ipc.finish_reason import FinishAbort, FinishLength, FinishReason
from radixserve.engine.tokenizer.io_struct import GenerateChunk, GenerateInput

BOS = 1


class FakeTokenizer:
    """Characters are ids 10..; "<s>" is BOS; the template starts with BOS (like Llama's)."""

    bos_token = "<s>"
    chat_template = "fake"

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        ids = [BOS] if text.startswith("<s>") else []
        ids += [10 + (ord(c) % 90) for c in text.removeprefix("<s>")]
        return [BOS, *ids] if add_special_tokens else ids

    def decode(self, ids: list[int]) -> str:
        return "".join("<s>" if i == BOS else chr(i - 10 + 32) for i in ids)

    def apply_chat_template(self, messages: list[dict[str, Any]], **kw: Any) -> str:
        assert kw == {"tokenize": False, "add_generation_prompt": True}
        return "<s>" + "|".join(f"{m['role']}:{m['content']}" for m in messages) + "|assistant:"


def _chunk(n_prompt: int, ids: list[int], finish: FinishReason | None) -> GenerateChunk:
    """The chunk bringing the last of `ids` (deltas only, as the TokenizerManager sends)."""
    return GenerateChunk(
        rid="r",
        text_delta="ab"[len(ids) - 1 : len(ids)] if ids else "",
        output_ids=ids[-1:],
        finish_reason=finish,
        prompt_tokens=n_prompt,
        completion_tokens=len(ids),
        cached_tokens=0,
        total_retractions=0,
        token_logprobs=[-0.5] * len(ids[-1:]),
    )


class FakeTM:
    """Generation scripted: two tokens, or an abort for prompts with "!" (validation is the
    routes' own, in front of it)."""

    def __init__(self, tokenizer: FakeTokenizer) -> None:
        self.tokenizer = tokenizer
        self.seen: list[GenerateInput] = []

    def tokenize(self, text: str) -> list[int]:
        return self.tokenizer.encode(text)

    async def generate(self, inp: GenerateInput) -> AsyncIterator[GenerateChunk]:
        self.seen.append(inp)
        n = len(inp.input_ids)
        if inp.text and "!" in inp.text:
            yield _chunk(n, [], FinishAbort("queue full", 503))
            return
        yield _chunk(n, [40], None)
        yield _chunk(n, [40, 41], FinishLength(2))


@pytest.fixture()
def app() -> tuple[TestClient, FakeTM]:
    tok = FakeTokenizer()
    tm = FakeTM(tok)
    app = FastAPI()
    app.state.server = SimpleNamespace(
        args=SimpleNamespace(model_name="m", tool_call_parser=None, reasoning_parser=None),
        tokenizer=tok,
        tokenizer_manager=tm,
        model_info={"context_length": 64},
        limits=ServerLimits(context_len=64, max_req_input_len=60, vocab_size=100),
    )
    install_error_handlers(app)
    install_openai_routes(app)
    return TestClient(app), tm


def _events(client: TestClient, path: str, body: dict[str, Any]) -> list[Any]:
    with client.stream("POST", path, json=body) as r:
        assert r.status_code == 200
        data = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert data[-1] == "[DONE]"
    return [json.loads(d) for d in data[:-1]]


def test_abort_fails_a_non_stream_request_with_its_status(app: tuple[TestClient, FakeTM]) -> None:
    client, _ = app
    r = client.post("/v1/completions", json={"model": "m", "prompt": "hi!", "max_tokens": 2})
    assert r.status_code == 503 and r.json()["message"] == "queue full"


def test_abort_in_a_stream_is_an_error_event(app: tuple[TestClient, FakeTM]) -> None:
    client, _ = app
    body = {"prompt": ["ok", "no!"], "max_tokens": 2, "stream": True}
    events = _events(client, "/v1/completions", body)
    assert events[-1]["error"]["message"] == "queue full" and events[-1]["error"]["code"] == 503
    chat = {"messages": [{"role": "user", "content": "no!"}], "max_tokens": 2, "stream": True}
    events = _events(client, "/v1/chat/completions", chat)
    assert events[0]["choices"][0]["delta"]["role"] == "assistant"
    assert events[-1]["error"]["message"] == "queue full"


def test_chat_template_bos_is_not_doubled(app: tuple[TestClient, FakeTM]) -> None:
    client, tm = app
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    r = client.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    ids = tm.seen[-1].input_ids
    assert ids[0] == BOS and ids[1] != BOS
    out = r.json()
    assert out["choices"][0]["message"] == {"role": "assistant", "content": "ab"}
    assert out["choices"][0]["finish_reason"] == "length"


def test_chat_default_max_tokens_fills_the_context(app: tuple[TestClient, FakeTM]) -> None:
    client, tm = app
    body = {"messages": [{"role": "user", "content": "hi"}]}
    assert client.post("/v1/chat/completions", json=body).status_code == 200
    inp = tm.seen[-1]
    assert inp.sampling_params.max_new_tokens == 64 - len(inp.input_ids) - 1


def test_sampling_params_mapping(app: tuple[TestClient, FakeTM]) -> None:
    client, tm = app
    body = {
        "prompt": [[20, 21], [22]],
        "n": 2,
        "seed": 5,
        "min_tokens": 1,
        "max_tokens": 3,
        "stop": "x",
        "top_k": 4,
        "user": "someone",
        "logprobs": 2,
    }
    r = client.post("/v1/completions", json=body)
    assert r.status_code == 200, r.text
    seen = tm.seen[-4:]
    assert [s.sampling_params.sampling_seed for s in seen] == [5, 6, 5, 6]
    assert all(s.top_logprobs_num == 2 and s.return_logprob for s in seen)
    p = seen[0].sampling_params
    assert (p.max_new_tokens, p.min_new_tokens, p.stop, p.top_k, p.n) == (3, 1, ["x"], 4, 1)
    out = r.json()
    assert [c["index"] for c in out["choices"]] == [0, 1, 2, 3]
    assert out["usage"]["prompt_tokens"] == 3 and out["usage"]["completion_tokens"] == 8
    lp = out["choices"][0]["logprobs"]
    assert lp["token_logprobs"] == [-0.5, -0.5] and lp["text_offset"] == [0, 1]


def test_usage_counts_each_prompt_once() -> None:
    def last(p: int, c: int, k: int) -> GenerateChunk:
        return GenerateChunk("r", "", [], FinishLength(c), p, c, k, 0)

    u = usage([last(10, 3, 0), last(10, 4, 9), last(5, 1, 2), last(5, 2, 0)], n=2)
    assert u == {
        "prompt_tokens": 15,
        "completion_tokens": 10,
        "total_tokens": 25,
        "prompt_tokens_details": {"cached_tokens": 11},
    }


def test_prompt_forms() -> None:
    tok = lambda s: [len(s)]  # noqa: E731
    assert prompt_list("abc", tok) == [("abc", [3])]  # Prompt is a NamedTuple
    assert prompt_list(["a", "bc"], tok) == [("a", [1]), ("bc", [2])]
    assert prompt_list([5, 6], tok) == [(None, [5, 6])]
    assert prompt_list([[5], [6, 7]], tok) == [(None, [5]), (None, [6, 7])]
    for bad in ([], [[]], [True], [1, "a"], None, 3, [[1], 2]):
        with pytest.raises(InvalidRequest, match="^prompt: "):
            prompt_list(bad, tok)


def test_engine_names_become_openai_names() -> None:
    assert str(rename_error(InvalidRequest("max_new_tokens: must be >= 0"))) == (
        "max_tokens: must be >= 0"
    )
    assert str(rename_error(InvalidRequest("top_p: bad"))) == "top_p: bad"
    msg = "min_new_tokens: must be <= max_new_tokens (4), got 9"
    assert str(rename_error(InvalidRequest(msg))) == "min_tokens: must be <= max_tokens (4), got 9"
