"""Prefill/decode pairs at different TP sizes, real servers with the KV moved by Mooncake over
TCP, on a tiny Llama with 2 KV heads: a prefill at tp=2 (one head per rank) serves a decode at
tp=1 (each token's row gathered from both prefill ranks), and a prefill at tp=1 serves a
decode at tp=2 (each token's row split between the decode's ranks). The 16-prompt batch of
test_tp_generate (shared prefixes, 32-token chunks, cache hits; the decode's pool small enough
to retract) gives the single-process run's greedy outputs; the bytes moved equal the prompts'
rows, counted on both sides; both sides come back to rest. The same batch through prefill tp=1
and decode tp=1 (whole pages). Equal TP sizes above 1: test_wire's 2 → 2."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tests.engine.disaggregation.pd_servers import Pair, at_rest, load, send_both
from tests.engine.distributed.test_tp_generate import PARAMS, POOL, prompts
from tests.engine.server.live_server import LiveServer, live_server
from tests.ports import free_port

pytestmark = pytest.mark.slow

COMMON = ("--dtype", "float32", "--chunked-prefill-size", "32", "--max-prefill-tokens", "96")
# tiny Llama (tests/engine/models/tiny.py), float32: K and V, 2 layers, 2 KV heads of 16
BYTES_PER_TOKEN = 2 * 2 * 2 * 16 * 4


@pytest.fixture(scope="module")
def reference(greedy_reference: Any) -> tuple[Path, list[list[int]]]:
    folder, want = greedy_reference("llama", 3)
    return folder, want


def _prefill(folder: Path, tp: int, log_dir: str) -> Iterator[tuple[LiveServer, int]]:
    port = free_port()
    args = ("--tp-size", str(tp), "--max-total-tokens", "4096", "--disaggregation-mode")
    args += ("prefill", "--disaggregation-bootstrap-port", str(port))
    with live_server(*COMMON, *args, model_path=str(folder), log_dir=log_dir) as srv:
        yield srv, port


# One fixture per TP size (not one parametrized indirectly: pytest keys an indirect module
# fixture by the parameter's index, so two tests at prefill tp 1 would start it twice).
@pytest.fixture(scope="module")
def prefill_tp1(
    reference: tuple[Path, list[list[int]]], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[LiveServer, int]]:
    yield from _prefill(reference[0], 1, str(tmp_path_factory.mktemp("prefill1")))


@pytest.fixture(scope="module")
def prefill_tp2(
    reference: tuple[Path, list[list[int]]], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[LiveServer, int]]:
    yield from _prefill(reference[0], 2, str(tmp_path_factory.mktemp("prefill2")))


def _decode(folder: Path, tp: int, log_dir: str) -> Any:
    args = ("--tp-size", str(tp), "--max-total-tokens", str(POOL), "--disaggregation-mode")
    # A decode reserves what its running requests may still generate before it takes a
    # prompt's KV; a small new-token ratio lets it take more, so that they outgrow the pool
    # and retract (retracted requests are prefilled again on the decode).
    args += ("decode", "--schedule-conservativeness", "0.1")
    return live_server(*COMMON, *args, model_path=str(folder), log_dir=log_dir)


def _round(pair: Pair, batch: list[list[int]]) -> list[dict[str, Any]]:
    def one(ids: list[int]) -> dict[str, Any]:
        p, d = send_both(pair, "/generate", {"input_ids": ids, "sampling_params": PARAMS})
        assert (p.status_code, d.status_code) == (200, 200), (p.text, d.text)
        out: dict[str, Any] = d.json()
        return out

    with ThreadPoolExecutor(len(batch)) as pool:
        return list(pool.map(one, batch))


def _wait_at_rest(*servers: LiveServer) -> None:
    deadline = time.monotonic() + 120  # turns a leak into a failure; no timing is asserted
    while not all(at_rest(s) for s in servers):
        assert time.monotonic() < deadline, [load(s) for s in servers]
        time.sleep(0.5)


# (2, 1) and (1, 2) re-slice the heads; (1, 1) is the prefill 1 + decode 1 on this batch
@pytest.mark.parametrize(("prefill_tp", "decode_tp"), [(2, 1), (1, 2), (1, 1)])
def test_prefill_and_decode_at_tp_sizes(
    reference: tuple[Path, list[list[int]]],
    prefill_tp: int,
    decode_tp: int,
    request: pytest.FixtureRequest,
    tmp_path: Path,
) -> None:
    folder, want = reference
    prefill_server, port = request.getfixturevalue(f"prefill_tp{prefill_tp}")
    with _decode(folder, decode_tp, str(tmp_path)) as decode:
        pair = Pair(prefill_server, decode, port)
        before_p, before_d = load(prefill_server), load(decode)
        outs = _round(pair, prompts())
        assert [o["output_ids"] for o in outs] == want
        assert sum(o["meta_info"]["total_retractions"] for o in outs) > 0  # the decode's pool
        tokens = sum(o["meta_info"]["prompt_tokens"] for o in outs)
        after_p, after_d = load(prefill_server), load(decode)
        key = "kv_transfer_bytes_total"
        moved = (after_p[key] - before_p[key], after_d[key] - before_d[key])
        assert moved == (tokens * BYTES_PER_TOKEN, tokens * BYTES_PER_TOKEN)
        _wait_at_rest(prefill_server, decode)
