"""OpenAI routes of a live server: bad requests are 400s naming the problem, a client that leaves
a stream aborts its request, and the server keeps serving afterwards."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
import openai
import pytest

from tests.engine.server.live_server import LiveServer

MODEL = "smollm2-135m"
CHAT = [{"role": "user", "content": "Hi"}]


@pytest.fixture(scope="module")
def client(server: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="x", max_retries=0, timeout=60)


def _completion_error(client: openai.OpenAI, **overrides: Any) -> str:
    kw: dict[str, Any] = {"model": MODEL, "prompt": "hi", "max_tokens": 4, **overrides}
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(**kw)
    assert info.value.status_code == 400
    return info.value.message


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({"model": "gpt-4"}, "The model `gpt-4` does not exist."),
        ({"prompt": [[1] * 9000]}, "longer than the model's context length (8192 tokens)"),
        ({"prompt": "hello " * 9000}, "longer than the model's context length"),
        ({"max_tokens": 9000}, "maximum context length of 8192"),
        ({"max_tokens": -1}, "max_tokens: must be >= 0"),
        ({"temperature": -1}, "temperature: must be >= 0"),
        ({"top_p": 2}, "top_p: must be in (0, 1]"),
        ({"n": 0}, "n: "),
        ({"stop": [""]}, "stop: "),
        ({"prompt": []}, "prompt: expected"),
        ({"prompt": [1, "a"]}, "prompt: expected"),
        ({"temperature": "hot"}, "temperature: "),
        ({"stream": True, "temperature": -1}, "temperature: must be >= 0"),
        ({"extra_body": {"top_k": 0}}, "top_k: "),
        ({"extra_body": {"min_tokens": 10}}, "min_tokens: must be <= max_tokens (4)"),
    ],
)
def test_completion_errors(client: openai.OpenAI, overrides: dict[str, Any], expected: str) -> None:
    assert expected in _completion_error(client, **overrides)


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({"model": "nope"}, "The model `nope` does not exist."),
        ({"max_completion_tokens": 9000}, "maximum context length"),
        ({"frequency_penalty": 3}, "frequency_penalty: "),
        ({"top_logprobs": 2}, "top_logprobs: requires logprobs"),
        ({"messages": []}, "messages: "),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
            "messages.0.content: only text parts",
        ),
        ({"stream": True, "top_p": 0}, "top_p: "),
    ],
)
def test_chat_errors(client: openai.OpenAI, overrides: dict[str, Any], expected: str) -> None:
    kw: dict[str, Any] = {"model": MODEL, "messages": CHAT, "max_tokens": 4, **overrides}
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(**kw)
    assert info.value.status_code == 400 and expected in info.value.message


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_malformed_json_is_a_400(server: LiveServer, path: str) -> None:
    r = httpx.post(server.base_url + path, content=b'{"model": ', timeout=30)
    assert r.status_code == 400
    body = r.json()
    assert body["object"] == "error" and "malformed JSON" in body["message"]
    r = httpx.post(server.base_url + path, json=["not", "an", "object"], timeout=30)
    assert r.status_code == 400 and "JSON object" in r.json()["message"]


def test_missing_required_field_names_it(server: LiveServer) -> None:
    r = httpx.post(server.base_url + "/v1/completions", json={"model": MODEL}, timeout=30)
    assert r.status_code == 400 and r.json()["message"].startswith("prompt:")


def _num_reqs(server: LiveServer) -> int:
    return httpx.get(server.base_url + "/get_load", timeout=10).json()["num_reqs"]


def test_leaving_a_stream_aborts_the_request(server: LiveServer) -> None:
    body = {
        "model": MODEL,
        "prompt": "Count forever:",
        "max_tokens": 4000,
        "stream": True,
        "ignore_eos": True,
    }
    with httpx.stream("POST", server.base_url + "/v1/completions", json=body, timeout=60) as r:
        assert r.status_code == 200
        lines = r.iter_lines()
        first = next(line for line in lines if line.startswith("data: "))
        assert json.loads(first[6:])["object"] == "text_completion"
    deadline = time.monotonic() + 20
    while _num_reqs(server) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _num_reqs(server) == 0


def test_server_still_serves_after_errors(client: openai.OpenAI) -> None:
    _completion_error(client, temperature=-1)
    r = client.completions.create(model=MODEL, prompt="Hello", max_tokens=2, temperature=0)
    assert r.usage.completion_tokens == 2
    c = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=2, temperature=0)
    assert c.choices[0].message.content
