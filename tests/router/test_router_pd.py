"""The router's PD mode (`--pd-disaggregation --prefill URL PORT --decode URL`, sglang-router's
command shape) in front of a real prefill and decode server; and sglang-router 0.3.2 itself in
front of the same pair, where it is installed (scripts/peers/setup_sglang_router.sh). The
oracle is a co-located server; the openai client reads the answers."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.child_env import child_env
from tests.engine.disaggregation.pd_servers import COMMON, Pair, at_rest, load, send_both
from tests.engine.server.live_server import LiveServer, live_server
from tests.ports import free_port
from tests.router.router_proc import router_proc

pytestmark = pytest.mark.slow

SGLANG_ROUTER = Path(os.environ.get("PEERS_DIR", "/work/peers")) / "venv_sglr/bin/python"
CHAT: dict[str, Any] = {"model": "smollm2-135m", "max_tokens": 16, "temperature": 0}
TURN_1 = [{"role": "user", "content": "Name a large city in France and say one fact about it."}]


# Shared with tests/engine/disaggregation/test_pd_servers.py (shared_pd.py): every test here
# leaves them at rest (_settle); the one that needs a failing decode starts its own.
@pytest.fixture(scope="module")
def colocated(pd_shared_colocated: LiveServer) -> LiveServer:
    return pd_shared_colocated


@pytest.fixture(scope="module")
def pair(pd_shared_pair: Pair) -> Pair:
    return pd_shared_pair


def _conversation(base_url: str) -> tuple[list[str], int]:
    """Two turns, the second extending the first (its prompt starts with the first's), then
    the first again as a stream: the texts, and the second turn's cached prompt tokens."""
    client = openai.OpenAI(base_url=base_url + "/v1", api_key="x", max_retries=0)
    first = client.chat.completions.create(**CHAT, messages=TURN_1).choices[0].message.content
    turn_2 = [*TURN_1, {"role": "assistant", "content": first or ""}]
    turn_2.append({"role": "user", "content": "And another fact?"})
    second = client.chat.completions.create(**CHAT, messages=turn_2)
    details = second.usage.prompt_tokens_details if second.usage else None
    cached = (details.cached_tokens or 0) if details else 0
    chunks = client.chat.completions.create(**CHAT, messages=TURN_1, stream=True)
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    return [first or "", second.choices[0].message.content or "", streamed], cached


def _settle(pair: Pair) -> None:
    deadline = time.monotonic() + 120
    while not (at_rest(pair.prefill) and at_rest(pair.decode)):
        assert time.monotonic() < deadline, "the pair did not come back to rest"
        time.sleep(0.5)


def test_our_router_in_pd_mode(colocated: LiveServer, pair: Pair) -> None:
    expected, _ = _conversation(colocated.base_url)
    before = load(pair.prefill)["kv_transfers_total"]
    args = ("--pd-disaggregation", "--prefill", pair.prefill.base_url, str(pair.bootstrap_port))
    with router_proc([], *args, "--decode", pair.decode.base_url, healthy=1) as router:
        texts, cached = _conversation(router.url)
        assert texts == expected
        assert cached > 0  # the later turn hit the prefill's radix cache
        body = {"text": "The capital of France is", "sampling_params": {"max_new_tokens": 4}}
        native = httpx.post(router.url + "/generate", json=body, timeout=300)
        assert native.status_code == 200 and len(native.json()["output_ids"]) == 4
    assert load(pair.prefill)["kv_transfers_total"] == before + 4  # every request went PD
    _settle(pair)


LOGPROB_PROMPT = "The capital of France is Paris, and the capital of Spain is"


def _logprob_body(start: int, top: int, max_new: int, stream: bool = False) -> dict[str, Any]:
    """A native /generate that asks for the prompt's logprobs from token `start`."""
    return {
        "text": LOGPROB_PROMPT,
        "sampling_params": {"max_new_tokens": max_new, "temperature": 0},
        "return_logprob": True,
        "logprob_start_len": start,
        "top_logprobs_num": top,
        "stream": stream,
    }


def _native_logprobs(url: str, stream: bool) -> dict[str, Any]:
    """Its (last) meta_info."""
    body = _logprob_body(0, 2, 3, stream)
    r = httpx.post(url + "/generate", json=body, timeout=300)
    assert r.status_code == 200, r.text
    if not stream:
        return dict(r.json()["meta_info"])
    events = [e[6:] for e in r.text.split("\n\n") if e.startswith("data: {")]
    metas = [json.loads(e)["meta_info"] for e in events]
    assert all("input_token_logprobs" in m for m in metas)  # every event, as co-located
    return dict(metas[-1])


def test_prompt_logprobs_come_from_the_prefill(colocated: LiveServer, pair: Pair) -> None:
    """Only the prefill computes the prompt: the router puts its input_token_logprobs into
    the decode's answer, streamed or not; they equal a co-located server's."""
    args = ("--pd-disaggregation", "--prefill", pair.prefill.base_url, str(pair.bootstrap_port))
    with router_proc([], *args, "--decode", pair.decode.base_url, healthy=1) as router:
        for stream in (False, True):
            want = _native_logprobs(colocated.base_url, stream)
            got = _native_logprobs(router.url, stream)
            rows, want_rows = got["input_token_logprobs"], want["input_token_logprobs"]
            assert [r[1] for r in rows] == [r[1] for r in want_rows]
            assert rows[0][0] is None
            assert [r[0] for r in rows[1:]] == pytest.approx(
                [r[0] for r in want_rows[1:]], abs=1e-4
            )
            assert [[t[1] for t in top] for top in got["input_top_logprobs"][1:]] == [
                [t[1] for t in top] for top in want["input_top_logprobs"][1:]
            ]
            outs, want_outs = got["output_token_logprobs"], want["output_token_logprobs"]
            assert [r[1] for r in outs] == [r[1] for r in want_outs]
            assert [r[0] for r in outs] == pytest.approx([r[0] for r in want_outs], abs=1e-4)
    _settle(pair)


def test_openai_echo_logprobs_through_the_pair(colocated: LiveServer, pair: Pair) -> None:
    """lm-eval's loglikelihood request (completions, echo + logprobs) through the router in PD
    mode: the prefill sends the prompt's log-probabilities with the KV, so the decode's own
    answer carries them, as a co-located server's."""
    args = ("--pd-disaggregation", "--prefill", pair.prefill.base_url, str(pair.bootstrap_port))

    def ask(url: str) -> Any:
        client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
        out = client.completions.create(
            model=client.models.list().data[0].id, prompt=LOGPROB_PROMPT, max_tokens=3,
            temperature=0, echo=True, logprobs=2,
        )  # fmt: skip
        return out.choices[0]

    want = ask(colocated.base_url)
    with router_proc([], *args, "--decode", pair.decode.base_url, healthy=1) as router:
        got = ask(router.url)
    assert got.text == want.text and got.logprobs.tokens == want.logprobs.tokens
    lps, want_lps = got.logprobs.token_logprobs, want.logprobs.token_logprobs
    assert lps[0] is None and want_lps[0] is None
    assert lps[1:] == pytest.approx(want_lps[1:], abs=1e-4)
    assert [sorted(t) for t in got.logprobs.top_logprobs[1:]] == [
        sorted(t) for t in want.logprobs.top_logprobs[1:]
    ]
    _settle(pair)


def test_the_decode_answers_the_prompts_logprobs_itself(pair: Pair) -> None:
    """Without a router to merge them: the decode's answer has the prefill's values."""
    p, d = send_both(pair, "/generate", _logprob_body(3, 1, 2))
    assert (p.status_code, d.status_code) == (200, 200), (p.text, d.text)
    prefill, decode = p.json()["meta_info"], d.json()["meta_info"]
    assert decode["input_token_logprobs"] == prefill["input_token_logprobs"]
    assert decode["input_top_logprobs"] == prefill["input_top_logprobs"]
    assert len(decode["input_token_logprobs"]) == decode["prompt_tokens"] - 3
    _settle(pair)


def test_router_pd_flags_are_sglang_routers() -> None:
    from radixserve.router.config import pd_workers

    urls, ports, decode = pd_workers(
        [["http://p1:8000", "9000"], ["http://p2:8000", "none"], ["http://p3:8000"]],
        ["http://d1:8001"],
    )
    assert urls == ("http://p1:8000", "http://p2:8000", "http://p3:8000")
    assert ports == {"http://p1:8000": 9000, "http://p2:8000": None, "http://p3:8000": None}
    assert decode == ("http://d1:8001",)
    with pytest.raises(ValueError, match="bootstrap port"):
        pd_workers([["http://p1:8000", "port"]], [])


@pytest.mark.skipif(not SGLANG_ROUTER.exists(), reason="sglang-router is not installed")
def test_sglang_router_fronts_our_pair(colocated: LiveServer, pair: Pair) -> None:
    expected, _ = _conversation(colocated.base_url)
    port = free_port()
    cmd = [
        str(SGLANG_ROUTER), "-m", "sglang_router.launch_router", "--host", "127.0.0.1",
        "--port", str(port), "--pd-disaggregation",
        "--prefill", pair.prefill.base_url, str(pair.bootstrap_port),
        "--decode", pair.decode.base_url,
    ]  # fmt: skip
    log = open(f"/tmp/sglang-router-pd-{port}.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd="/tmp", env=child_env())
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, "sglang-router down"
            time.sleep(0.5)
        before = load(pair.prefill)["kv_transfers_total"]
        texts, cached = _conversation(url)
        assert texts == expected and cached > 0
        assert load(pair.prefill)["kv_transfers_total"] == before + 3
    finally:
        proc.terminate()
        proc.wait(20)
        log.close()
    _settle(pair)


def test_a_failing_decode_is_retried_on_another_pair(pair: Pair) -> None:
    """A decode that refuses every pair (its page size disagrees: a 500 before any byte went
    out) makes the router retry on the other decode with a new room: every answer is a 200."""
    odd_args = (*COMMON, "--disaggregation-mode", "decode", "--page-size", "16")
    with live_server(*odd_args) as odd:
        args = ("--pd-disaggregation", "--prefill", pair.prefill.base_url, str(pair.bootstrap_port))
        args += ("--decode", odd.base_url, "--decode", pair.decode.base_url)
        with router_proc([], *args, "--decode-policy", "round_robin", healthy=1) as router:
            body = {"text": "Retry me", "sampling_params": {"max_new_tokens": 4}}
            answers = [
                httpx.post(router.url + "/generate", json=body, timeout=300) for _ in range(4)
            ]
            assert [a.status_code for a in answers] == [200] * 4
            retries = router.metrics().get(("radixserve_router_retries_total", frozenset()), 0)
            assert retries >= 1
            assert load(odd)["bootstrap_failed_total"] >= 1
    _settle(pair)
