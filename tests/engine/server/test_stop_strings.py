"""Stop strings through a live server: the detokenizer finds the string, the stream carries
exactly the text before it and the count of ids up to the one that completed it, the scheduler
stops the request, and the requests beside it are served as before. The oracle is the
tokenizer's own `decode` of the ids of a run without the stop string."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import httpx
import pytest

from tests.engine.server.live_server import LiveServer
from tests.engine.stop_oracle import StopCase, completing, mid_token_stop

PROMPT = "Once upon a time, in a small village,"
GREEDY = {"temperature": 0, "max_new_tokens": 24, "ignore_eos": True}
MANY = 400  # far more tokens than the stop string needs: only the stop ends the request


@pytest.fixture(scope="module")
def tokenizer(smollm_source: Any) -> Any:
    from radixserve.engine.model_loader.loader import load_tokenizer

    return load_tokenizer(smollm_source)


@pytest.fixture(scope="module")
def unstopped(server: LiveServer) -> list[int]:
    body = {"text": PROMPT, "sampling_params": GREEDY}
    out = httpx.post(server.base_url + "/generate", json=body, timeout=300).json()
    ids: list[int] = out["output_ids"]
    return ids


async def stream(client: httpx.AsyncClient, url: str, text: str, params: dict) -> list[dict]:
    """Every chunk of a streamed native /generate (each carries the cumulative text)."""
    body = {"text": text, "stream": True, "sampling_params": params}
    chunks = []
    async with client.stream("POST", url + "/generate", json=body) as r:
        assert r.status_code == 200
        async for line in r.aiter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(json.loads(line[6:]))
    return chunks


async def streams(url: str, stop: str, num_others: int) -> list[list[dict]]:
    """The stream with the stop string, and `num_others` without one running beside it."""
    async with httpx.AsyncClient(timeout=300) as client:
        return await asyncio.gather(
            stream(client, url, PROMPT, {**GREEDY, "max_new_tokens": MANY, "stop": stop}),
            *(stream(client, url, f"Story {i}:", GREEDY) for i in range(num_others)),
        )


def wait_until(cond: Any, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.2)


def assert_stopped(chunks: list[dict], case: StopCase) -> None:
    last = chunks[-1]
    assert last["text"] == case.text
    assert all(case.text.startswith(c["text"]) for c in chunks)  # no stop-string start leaked
    assert last["meta_info"]["finish_reason"] == {"type": "stop", "matched": case.stop}
    assert last["meta_info"]["completion_tokens"] == case.num_ids == len(last["output_ids"])


def test_streamed_stop_string_ends_the_request(
    server: LiveServer, tokenizer: Any, unstopped: list[int]
) -> None:
    url = server.base_url
    case = mid_token_stop(tokenizer, unstopped)
    wait_until(lambda: httpx.post(url + "/flush_cache", timeout=10).status_code == 200)
    (chunks,) = asyncio.run(streams(url, case.stop, 0))
    assert_stopped(chunks, case)
    assert chunks[-1]["output_ids"] == unstopped[: case.num_ids]
    # The scheduler ended it: once it is idle, its cache holds the prompt and about the ids
    # up to the stop, not the MANY the request asked for.
    wait_until(lambda: httpx.get(url + "/get_load", timeout=10).json()["num_reqs"] == 0)
    pages = httpx.get(url + "/debug/cache_pages", timeout=10).json()["page_hashes"]
    assert len(pages) < len(tokenizer.encode(PROMPT)) + MANY // 2


def test_stop_string_beside_other_streams(
    server: LiveServer, tokenizer: Any, unstopped: list[int]
) -> None:
    url = server.base_url
    stop = mid_token_stop(tokenizer, unstopped).stop
    stopped, *others = asyncio.run(streams(url, stop, 3))
    ids = stopped[-1]["output_ids"]  # its own run: the oracle is its own ids' text
    text = tokenizer.decode(ids)
    assert_stopped(
        stopped, StopCase(stop, completing(tokenizer, ids, stop), text[: text.find(stop)])
    )
    for other in others:
        assert other[-1]["meta_info"]["finish_reason"] == {"type": "length", "length": 24}
    body = {"text": PROMPT, "sampling_params": GREEDY}
    again = httpx.post(url + "/generate", json=body, timeout=300).json()
    assert again["meta_info"]["completion_tokens"] == 24  # and it serves on
