"""Engine faults on one live server with a small KV pool: the pool exhausted by long prompts and
long outputs, and a request aborted at every stage (queued, prefilling in chunks, decoding,
retracted). The oracles are the engine's own reports: /get_load's token usage (free plus
evictable must be the whole pool once idle), the `cached_tokens` of a follow-up request (how
much of an aborted prompt reached the radix cache), the retraction counter in /metrics, and
the finish reasons and token counts of the answers.

The server: a tiny random-weight Llama with a 4,096-token context but a 2,048-token pool, a
4-token prefill chunk (a long prompt prefills over hundreds of steps, so a test can act in the
middle of it), and optimistic admission (`--schedule-conservativeness 0.05`), so decode runs
out of KV and retracts instead of admission holding requests back.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.engine.models.tiny import VOCAB, save_tiny
from tests.engine.server.live_server import LiveServer, live_server
from tests.reliability.live_streams import (
    LiveStream,
    assert_kv_at_rest,
    body,
    ids,
    load,
    metric,
    wait_idle,
    wait_until,
)

POOL = 2048
CONTEXT = 4096
CHUNK = 4


@pytest.fixture(scope="module")
def small_pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    folder: Path = tmp_path_factory.mktemp("tiny-llama-4k")
    save_tiny("llama", folder, seed=0, max_position_embeddings=CONTEXT)
    with live_server(
        "--model-path", str(folder), "--max-total-tokens", str(POOL),
        "--chunked-prefill-size", str(CHUNK), "--schedule-conservativeness", "0.05",
        "--max-queued-requests", "64",
        env={"OMP_NUM_THREADS": "1"},
    ) as srv:  # fmt: skip
        yield srv


def _post(base_url: str, payload: dict) -> httpx.Response:
    return httpx.post(base_url + "/generate", json=payload, timeout=300)


def _cached_tokens(base_url: str, prompt: list[int]) -> int:
    """How much of `prompt` the radix cache holds, as the engine reports for a 1-token run."""
    resp = _post(base_url, body(prompt, 1))
    assert resp.status_code == 200, resp.text
    return int(resp.json()["meta_info"]["cached_tokens"])


# ---- the pool exhausted ---------------------------------------------------------------------

# (prompt tokens, new tokens): each fits the pool alone, together they need ~3x the pool.
EXHAUST = [(16, 1500), (16, 1200), (40, 1000), (300, 800), (600, 600), (1000, 400), (1500, 300)]


async def _all(base_url: str, payloads: list[dict]) -> list[httpx.Response]:
    async with httpx.AsyncClient(timeout=600) as client:
        return list(
            await asyncio.gather(*(client.post(base_url + "/generate", json=p) for p in payloads))
        )


def test_pool_exhausted_by_long_prompts_and_outputs_retracts_and_finishes_all(
    small_pool: LiveServer,
) -> None:
    url = small_pool.base_url
    rng = random.Random(1)
    before = metric(url, "num_retractions_total")
    payloads = [body(ids(rng, n, VOCAB), m) for n, m in EXHAUST]
    # Beyond the pool but inside the context: refused up front, not admitted to hang or crash.
    too_long = body(ids(rng, POOL, VOCAB), 4)
    answers = asyncio.run(_all(url, [*payloads, too_long]))
    for (_, new), resp in zip(EXHAUST, answers, strict=False):
        assert resp.status_code == 200, resp.text
        out = resp.json()
        assert out["meta_info"]["finish_reason"] == {"type": "length", "length": new}, out
        assert len(out["output_ids"]) == new
    refused = answers[-1]
    assert refused.status_code == 400, refused.text
    err = refused.json()
    assert err["object"] == "error" and err["param"] == "input_ids", err
    assert f"limit of {POOL - 6} tokens" in err["message"], err
    retracted = metric(url, "num_retractions_total") - before
    assert retracted >= 1, "the pool never ran out: the test did not exhaust it"
    assert small_pool.proc.poll() is None
    assert httpx.get(url + "/health_generate", timeout=60).status_code == 200
    assert_kv_at_rest(url)


# ---- aborts at every stage ------------------------------------------------------------------


def test_abort_queued_and_mid_chunked_prefill_free_their_kv(small_pool: LiveServer) -> None:
    """A long prompt prefills 4 tokens a step; a second request waits behind it in the queue.
    The queued one leaves first (nothing of it may reach the cache), then the prefilling one
    (what it prefilled stays in the cache as evictable, nothing stays in use, and the rest of
    its prompt is never prefilled)."""
    url = small_pool.base_url
    rng = random.Random(2)
    assert_kv_at_rest(url)
    long_prompt, queued_prompt = ids(rng, 1000, VOCAB), ids(rng, 64, VOCAB)
    prefilling = LiveStream(url, body(long_prompt, 4))
    wait_until(lambda: load(url)["num_running_reqs"] == 1, 60, "the long prompt to prefill")
    queued = LiveStream(url, body(queued_prompt, 4))
    wait_until(lambda: load(url)["num_waiting_reqs"] == 1, 30, "the second request to queue")
    queued.cut()
    wait_until(lambda: load(url)["num_waiting_reqs"] == 0, 30, "the queued request to go")
    assert load(url)["num_running_reqs"] == 1, "the long prompt finished prefill too early"
    assert not prefilling.chunks, "the long prompt produced a token before the abort"
    prefilling.cut()
    assert_kv_at_rest(url)
    assert not queued.chunks and not prefilling.chunks
    # Where each one was, from what the cache holds of its prompt: nothing of the queued one.
    assert _cached_tokens(url, queued_prompt) == 0
    held = _cached_tokens(url, long_prompt)
    assert held >= CHUNK, held
    assert_kv_at_rest(url)
    # the abort ended the prefill at the next step: the rest of the prompt was never computed
    assert held <= len(long_prompt) - 2 * CHUNK, f"the whole prompt was prefilled ({held})"


def test_abort_retracted_and_decoding_free_their_kv(small_pool: LiveServer) -> None:
    """Two long decodes outgrow the pool: the later one (fewer tokens) is retracted to the
    queue and waits there. It is aborted by rid while it waits, then the other one by a client
    disconnect while it decodes."""
    url = small_pool.base_url
    rng = random.Random(3)
    assert_kv_at_rest(url)
    before = metric(url, "num_retractions_total")
    first = LiveStream(url, body(ids(rng, 16, VOCAB), 1800))
    wait_until(lambda: first.tokens >= 20, 60, "the first decode")
    second = LiveStream(url, body(ids(rng, 16, VOCAB), 1800))
    wait_until(lambda: second.tokens >= 1, 60, "the second decode")

    def second_retracted() -> bool:
        now = load(url)
        return now["num_waiting_reqs"] == 1 and now["num_running_reqs"] == 1

    wait_until(second_retracted, 120, "a retraction")
    assert first.tokens < 1800, "the first request ended before the retracted one could wait"
    rid = second.last["meta_info"]["id"]
    resp = httpx.post(url + "/abort_request", json={"rid": rid}, timeout=30)
    assert resp.status_code == 200, resp.text
    second.join(60)
    meta = second.last["meta_info"]
    assert meta["finish_reason"]["type"] == "abort", meta
    assert meta["total_retractions"] >= 1 and 0 < meta["completion_tokens"] < 1800, meta
    wait_until(lambda: load(url)["num_waiting_reqs"] == 0, 30, "the retracted request to go")
    wait_until(lambda: first.tokens >= 1 and load(url)["num_running_reqs"] == 1, 30, "decode")
    first.cut()
    assert_kv_at_rest(url)
    assert metric(url, "num_retractions_total") - before >= 1
    assert small_pool.proc.poll() is None
    wait_idle(url)
