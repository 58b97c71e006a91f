"""Native SGLang endpoints of a live server."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.engine.server.live_server import LiveServer

GREEDY = {"max_new_tokens": 6, "temperature": 0}


def test_generate_text_and_stream_agree(server: LiveServer) -> None:
    body = {"text": "The capital of France is", "sampling_params": GREEDY}
    plain = httpx.post(server.base_url + "/generate", json=body, timeout=60).json()
    assert plain["meta_info"]["completion_tokens"] == 6
    assert plain["meta_info"]["finish_reason"] == {"type": "length", "length": 6}
    chunks = []
    with httpx.stream(
        "POST", server.base_url + "/generate", json={**body, "stream": True}, timeout=60
    ) as r:
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(json.loads(line[6:]))
    assert len(chunks) == 6
    assert chunks[-1]["text"] == plain["text"]
    assert chunks[-1]["output_ids"] == plain["output_ids"]


def test_server_info_reports_pool_and_page_size(server: LiveServer) -> None:
    info = httpx.get(server.base_url + "/server_info", timeout=10).json()
    assert info["page_size"] == 1 and info["max_total_num_tokens"] == 32768


def test_bad_sampling_param_is_a_400_naming_the_field(server: LiveServer) -> None:
    r = httpx.post(
        server.base_url + "/generate",
        json={"text": "hi", "sampling_params": {"top_p": 0}},
        timeout=30,
    )
    assert r.status_code == 400
    body = r.json()
    assert body["object"] == "error" and body["message"].startswith("top_p")


@pytest.mark.parametrize("start", ["0", 1.5, -3, 50])
def test_bad_logprob_start_len_is_a_400_naming_the_field(server: LiveServer, start: object) -> None:
    body = {"text": "hi", "return_logprob": True, "logprob_start_len": start}
    r = httpx.post(server.base_url + "/generate", json=body, timeout=30)
    assert r.status_code == 400 and r.json()["message"].startswith("logprob_start_len: ")


def test_malformed_json_is_a_400(server: LiveServer) -> None:
    r = httpx.post(server.base_url + "/generate", content=b"{not json", timeout=30)
    assert r.status_code == 400 and "JSON" in r.json()["message"]


def test_tokenize_detokenize_round_trip(server: LiveServer) -> None:
    ids = httpx.post(
        server.base_url + "/tokenize", json={"prompt": "hello world"}, timeout=10
    ).json()["tokens"]
    text = httpx.post(server.base_url + "/detokenize", json={"tokens": ids}, timeout=10).json()
    assert text["text"] == "hello world"
