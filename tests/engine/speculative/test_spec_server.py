"""NGRAM speculation behind the real server (its processes, HTTP, the detokenizer): streamed
and whole answers agree with the plain in-process engine, a stop string ends the request at the
same text, a client that disconnects mid-stream aborts it and leaves the pool at rest, and the
speculation shows on /metrics and in meta_info. Bad flags fail at start-up, naming the flag."""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.engine.server.live_server import LiveServer, live_server
from tests.engine.speculative.test_spec_greedy import CODE

PROMPT = f"Copy this code exactly:\n\n{CODE}\nThe copy:\n\n"
GREEDY = {"temperature": 0, "max_new_tokens": 48}


@pytest.fixture(scope="module")
def server() -> Iterator[LiveServer]:
    args = ("--max-total-tokens", "16384", "--dtype", "float32", "--speculative-algorithm", "NGRAM")
    with live_server(*args) as srv:
        yield srv


def generate(server: LiveServer, params: dict[str, Any], stream: bool = False) -> Any:
    body = {"text": PROMPT, "sampling_params": params, "stream": stream}
    if not stream:
        return httpx.post(server.base_url + "/generate", json=body, timeout=120).json()
    chunks = []
    with httpx.stream("POST", server.base_url + "/generate", json=body, timeout=120) as resp:
        for line in resp.iter_lines():
            if line.startswith("data:") and line != "data: [DONE]":
                chunks.append(json.loads(line[5:]))
    return chunks


def test_stream_and_whole_answers_match_the_plain_engine(
    server: LiveServer, smollm_engine: Any
) -> None:
    expected = smollm_engine.generate(prompt=PROMPT, sampling_params=GREEDY)
    whole = generate(server, GREEDY)
    assert whole["output_ids"] == expected["output_ids"]
    assert whole["text"] == expected["text"]
    meta = whole["meta_info"]
    assert meta["spec_verify_ct"] > 0 and meta["spec_accept_length"] > 1.5
    assert meta["spec_num_correct_drafts"] + meta["spec_verify_ct"] <= meta["completion_tokens"]
    chunks = generate(server, GREEDY, stream=True)
    assert chunks[-1]["text"] == expected["text"]  # /generate streams the text so far
    sizes = [len(c["output_ids"]) for c in chunks]
    assert any(b > a + 1 for a, b in itertools.pairwise(sizes))  # several tokens in one step


def test_stop_string_ends_at_the_same_text(server: LiveServer, smollm_engine: Any) -> None:
    full = smollm_engine.generate(prompt=PROMPT, sampling_params=GREEDY)["text"]
    stop = full[full.index("return") : full.index("return") + 12]  # inside a drafted span
    params = {**GREEDY, "stop": [stop]}
    expected = smollm_engine.generate(prompt=PROMPT, sampling_params=params)
    got = generate(server, params)
    assert got["text"] == expected["text"] == full[: full.index(stop)]
    assert got["meta_info"]["finish_reason"] == expected["meta_info"]["finish_reason"]
    assert generate(server, params, stream=True)[-1]["text"] == expected["text"]


def test_disconnect_mid_stream_aborts_and_frees_the_pool(server: LiveServer) -> None:
    body = {"text": PROMPT, "sampling_params": {**GREEDY, "max_new_tokens": 4000}, "stream": True}
    with httpx.stream("POST", server.base_url + "/generate", json=body, timeout=60) as resp:
        for n, _ in enumerate(resp.iter_lines()):
            if n > 10:
                break  # leave with the request running
    deadline = time.monotonic() + 30
    while httpx.get(server.base_url + "/get_load", timeout=10).json()["num_reqs"]:
        assert time.monotonic() < deadline, "the request was not aborted"
        time.sleep(0.2)
    state = httpx.get(server.base_url + "/server_info", timeout=10).json()
    assert state["speculative_algorithm"] == "NGRAM"
    load = httpx.get(server.base_url + "/get_load", timeout=10).json()
    assert load["num_prefill_bootstrap_queue_reqs"] == 0  # fields at their default stay
    assert load["spec"]["verify_steps"] > 0 and load["hicache"] is None


def test_metrics_show_the_acceptance(server: LiveServer) -> None:
    generate(server, GREEDY)
    text = httpx.get(server.base_url + "/metrics", timeout=10).text
    values = {
        line.split("{")[0]: float(line.split()[-1])
        for line in text.splitlines()
        if line.startswith("radixserve:spec_")
    }
    assert values["radixserve:spec_accept_length"] > 1.5
    assert values["radixserve:spec_accepted_drafts_total"] > 0
    assert values["radixserve:spec_verify_steps_total"] > 0
    assert values["radixserve:spec_verify_seconds_total"] > 0
    assert values["radixserve:spec_accept_length_per_request_count"] > 0
    assert 'radixserve:spec_accept_length_per_request_bucket{dp_rank="0",le="1.0"' in text


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (
            {"speculative_num_draft_tokens": 1},
            r"^speculative_num_draft_tokens: must be in \[2, 64\]",
        ),
        ({"speculative_num_draft_tokens": 65}, r"^speculative_num_draft_tokens: must be in"),
        (
            {"speculative_ngram_min_match_window_size": 0},
            r"^speculative_ngram_min_match_window_size: must be ≥ 1",
        ),
        (
            {
                "speculative_ngram_min_match_window_size": 4,
                "speculative_ngram_max_match_window_size": 3,
            },
            r"^speculative_ngram_max_match_window_size: must be ≥ the min",
        ),
        ({"speculative_ngram_capacity": 0}, r"^speculative_ngram_capacity: must be ≥ 1"),
        ({"speculative_algorithm": "MEDUSA"}, r"^speculative_algorithm: must be one of NGRAM"),
        (
            {"enable_dp_attention": True, "dp_size": 2, "tp_size": 2},
            r"^speculative_algorithm: does not run with --enable-dp-attention",
        ),
        (
            {"speculative_algorithm": "STANDALONE"},
            r"^speculative_draft_model_path: STANDALONE needs a draft model",
        ),
        (
            {
                "speculative_algorithm": "STANDALONE",
                "speculative_draft_model_path": "smollm2-135m",
                "speculative_num_steps": 3,
                "speculative_num_draft_tokens": 6,
            },
            r"^speculative_num_draft_tokens: with a chain \(topk 1\) must be .* = 4, got 6",
        ),
        ({"speculative_eagle_topk": 4}, r"^speculative_eagle_topk: only 1"),
        (
            {"disable_overlap_schedule": False},
            r"^disable_overlap_schedule: speculative decoding runs without the overlap loop",
        ),
    ],
)
def test_bad_flags_fail_at_start_up(tmp_path: Path, flags: dict[str, Any], message: str) -> None:
    from radixserve.engine import Engine

    with pytest.raises(ValueError, match=message):
        Engine(model_path="smollm2-135m", **{"speculative_algorithm": "NGRAM", **flags})


def test_a_draft_with_another_vocabulary_is_refused(tmp_path: Path) -> None:
    from radixserve.engine import Engine
    from tests.engine.models.tiny import save_tiny

    save_tiny("llama", tmp_path / "target", seed=1)
    save_tiny("llama", tmp_path / "draft", seed=2, vocab_size=128)
    flags = {"speculative_algorithm": "STANDALONE", "speculative_num_steps": 2}
    with pytest.raises(ValueError, match=r"^speculative_draft_model_path: the draft's vocabulary "):
        Engine(
            model_path=str(tmp_path / "target"),
            speculative_draft_model_path=str(tmp_path / "draft"),
            **flags,
        )
    with pytest.raises(ValueError, match=r"^speculative_draft_model_path: cannot load '/no/such'"):
        Engine(
            model_path=str(tmp_path / "target"), speculative_draft_model_path="/no/such", **flags
        )
