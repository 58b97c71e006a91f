"""Prefill and decode schedulers in one process over the `fake` transfer backend (a memmove):
the queues, the control messages and the page bookkeeping, stepped by hand. The oracle is the
co-located (null-mode) scheduler on the same weights."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from radixserve.engine.configs.server_args import ServerArgs
from radixserve.engine.entrypoints.request_builder import (
    OutputOptions,
    Prompt,
    ServerLimits,
    build_inputs,
)
from radixserve.engine.ipc.messages import Bootstrap
from radixserve.engine.mem_cache.hiradix_cache import HiRadixCache
from radixserve.engine.scheduler.req import Req
from radixserve.engine.scheduler.scheduler_core import SchedulerCore
from tests.conftest import PROMPTS
from tests.ports import free_port

BASE = {"model_path": "smollm2-135m", "dtype": "float32", "max_total_tokens": 4096}
GREEDY = {"temperature": 0, "max_new_tokens": 12, "ignore_eos": True}


@pytest.fixture(scope="module")
def colocated() -> Iterator[SchedulerCore]:
    core = SchedulerCore(ServerArgs.from_kwargs(**BASE))
    yield core
    core.close()


def _pair(
    colocated: SchedulerCore,
    prefill: dict[str, Any],
    decode: dict[str, Any],
    backend: str = "fake",
) -> tuple[SchedulerCore, SchedulerCore, int]:
    port = free_port()
    p = _prefill(colocated, port, backend, **prefill)
    d = colocated.with_args(
        **decode, disaggregation_mode="decode", disaggregation_transfer_backend=backend
    )
    return p, d, port


def _prefill(
    colocated: SchedulerCore, port: int, backend: str = "fake", **args: Any
) -> SchedulerCore:
    """A prefill core (fake transfer unless told) serving bootstrap on `port`."""
    return colocated.with_args(
        **args,
        disaggregation_mode="prefill",
        disaggregation_transfer_backend=backend,
        disaggregation_bootstrap_port=port,
    )


def _reqs(
    core: SchedulerCore,
    prompts: list[str],
    port: int | None,
    first_room: int,
    params: dict[str, Any] = GREEDY,
) -> list[Req]:
    tok = _tokenizer()
    limits = ServerLimits(2048, 4000, core.model_config.vocab_size)
    inputs = build_inputs(
        [Prompt(t, list(tok.encode(t))) for t in prompts],
        [dict(params) for _ in prompts],
        limits,
        OutputOptions(),
    )
    reqs = []
    for i, inp in enumerate(inputs):
        msg = inp.tokenized(tok.eos_token_id)
        if port is not None:
            msg = type(msg)(
                **{**_fields(msg), "bootstrap": Bootstrap("127.0.0.1", port, first_room + i)}
            )
        reqs.append(core.make_req(msg))
    return reqs


def _fields(msg: Any) -> dict[str, Any]:
    return {f: getattr(msg, f) for f in msg.__struct_fields__}


_TOK: list[Any] = []


def _tokenizer() -> Any:
    if not _TOK:
        from radixserve.engine.model_loader import resolve_model
        from radixserve.engine.model_loader.loader import load_tokenizer

        _TOK.append(load_tokenizer(resolve_model("smollm2-135m")))
    return _TOK[0]


def _run(cores: list[SchedulerCore], reqs: list[Req], limit_s: float = 120) -> None:
    """Step every core until the requests finished and nothing is left anywhere (the limit
    only turns a hang into a failure)."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if all(r.finished() for r in reqs) and not any(c.scheduler.has_work() for c in cores):
            return
        for core in cores:
            core.scheduler.step()
        time.sleep(0.001)  # the bootstrap lookups run on threads
    states = [(r.rid[:6], r.finished_reason, len(r.output_ids)) for r in reqs]
    raise AssertionError(f"the pair did not settle: {states}")


def _colocated_outputs(
    core: SchedulerCore, prompts: list[str], params: dict[str, Any] = GREEDY
) -> list[list[int]]:
    reqs = _reqs(core, prompts, None, 0, params)
    for r in reqs:
        core.scheduler.add_request(r)
    _run([core], reqs)
    return [r.output_ids for r in reqs]


@pytest.mark.parametrize("backend", ["fake", "nixl"])
def test_pair_matches_colocated_and_frees_everything(
    colocated: SchedulerCore, backend: str
) -> None:
    """`nixl`: two real NIXL agents (UCX), each with its metadata listener, in one process."""
    expected = _colocated_outputs(colocated, PROMPTS)
    p, d, port = _pair(colocated, {}, {}, backend)
    try:
        preqs, dreqs = _reqs(p, PROMPTS, port, 100), _reqs(d, PROMPTS, port, 100)
        for r in dreqs + preqs:  # the decode first: the prefill must keep early messages
            (d if r in dreqs else p).scheduler.add_request(r)
        _run([p, d], preqs + dreqs)
        assert [r.output_ids for r in dreqs] == expected
        assert all(len(r.output_ids) == 1 for r in preqs)
        for core in (p, d):
            core.scheduler.check_memory_invariant()
        load_p, load_d = p.scheduler.load(), d.scheduler.load()
        assert load_p.kv_transfer_bytes_total == load_d.kv_transfer_bytes_total > 0
        assert load_p.kv_transfer_pages_total == sum(len(r.origin_input_ids) for r in preqs)
    finally:
        p.close()
        d.close()


def _common(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def test_decode_with_a_radix_cache_is_sent_only_the_pages_it_lacks(
    colocated: SchedulerCore,
) -> None:
    ps = 16
    first = PROMPTS[4]
    second = first + " The woodcutter went into the forest and found"
    expected = _colocated_outputs(colocated.with_args(page_size=ps), [first, second])
    p, d, port = _pair(
        colocated,
        {"page_size": ps},
        {"page_size": ps, "disaggregation_decode_enable_radix_cache": True},
    )
    try:
        got, moved = [], []
        for i, text in enumerate([first, second]):
            before = d.scheduler.load().kv_transfer_pages_total
            (preq,), (dreq,) = _reqs(p, [text], port, 500 + i), _reqs(d, [text], port, 500 + i)
            p.scheduler.add_request(preq)
            d.scheduler.add_request(dreq)
            _run([p, d], [preq, dreq])
            got.append(dreq.output_ids)
            moved.append(d.scheduler.load().kv_transfer_pages_total - before)
            held = dreq
        assert got == expected
        ids1 = _reqs(p, [first], None, 0)[0].origin_input_ids
        ids2 = held.origin_input_ids
        # what the decode cached of the first request: its prompt and outputs but the last
        cached = _common(ids1 + got[0][:-1], ids2) // ps * ps
        assert moved == [-(-len(ids1) // ps), -(-len(ids2) // ps) - cached // ps]
        assert moved[1] < -(-len(ids2) // ps)  # the second sent fewer than all its pages
        assert p.scheduler.load().kv_transfer_pages_total == sum(moved)
        for core in (p, d):
            core.scheduler.check_memory_invariant()
    finally:
        p.close()
        d.close()


def test_hicache_on_both_sides_keeps_the_outputs(colocated: SchedulerCore, tmp_path: Any) -> None:
    """HiCache under PD. The prefill's pool is too small for six tenants' system prompts: they
    are demoted to its host tier and its storage folder, and loaded back for the tenants'
    second questions; the decode keeps a radix cache with a host tier of its own. A fresh
    prefill over the same folder then reads the prefixes from storage. Every output is the
    co-located server's."""
    from tests.engine.mem_cache.test_hicache_outputs import QUESTIONS, system_prompt

    ps, tenants = 16, 6
    rounds = [
        [f"{system_prompt(t)}\nUser: {QUESTIONS[(t + k) % len(QUESTIONS)]}" for t in range(tenants)]
        for k in range(3)
    ]
    paged = colocated.with_args(page_size=ps)
    expected = [_colocated_outputs(paged, r) for r in rounds]
    paged.close()
    extra = f'{{"file_storage_path": "{tmp_path}", "prefetch_threshold": 64}}'
    hicache = {
        "page_size": ps, "enable_hierarchical_cache": True, "hicache_ratio": 4.0,
    }  # fmt: skip
    storage = {
        "hicache_storage_backend": "file", "hicache_storage_backend_extra_config": extra,
    }  # fmt: skip
    decode = {**hicache, "disaggregation_decode_enable_radix_cache": True}
    p, d, port = _pair(colocated, {**hicache, **storage, "max_total_tokens": 384}, decode)
    got = []
    try:
        for i, texts in enumerate(rounds[:2]):
            got.append(_serve_pair(p, d, port, texts, 900 + 10 * i))
        assert _hicache(p).stats.host_hit_tokens > 0
        storage_tier = _hicache(p).storage
        assert storage_tier is not None
        storage_tier.flush()
        p.close()
        # a fresh prefill over the same folder (nothing on its device or host), elsewhere
        port = free_port()
        p = _prefill(colocated, port, **hicache, **storage, max_total_tokens=384)
        got.append(_serve_pair(p, d, port, rounds[2], 950))
        assert _hicache(p).stats.storage_hit_tokens >= tenants * 96  # each system prompt
        assert got == expected
        for core in (p, d):
            core.scheduler.check_memory_invariant()
    finally:
        p.close()
        d.close()


def _hicache(core: SchedulerCore) -> HiRadixCache:
    cache = core.scheduler.tree_cache
    assert isinstance(cache, HiRadixCache)
    return cache


def _serve_pair(
    p: SchedulerCore, d: SchedulerCore, port: int, texts: list[str], room: int
) -> list[list[int]]:
    preqs, dreqs = _reqs(p, texts, port, room), _reqs(d, texts, port, room)
    for r in dreqs + preqs:
        (d if r in dreqs else p).scheduler.add_request(r)
    _run([p, d], preqs + dreqs)
    return [r.output_ids for r in dreqs]


def test_a_prefill_restarted_at_the_same_address_is_found_again(
    colocated: SchedulerCore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A prefill that restarts at the same bootstrap address (a container restarted in its pod)
    has new control endpoints. The decode's heartbeat sees the bootstrap server's new session,
    looks the prefill up again and sends the waiting rooms' KV requests there: the requests
    the router sent to the new process complete, with the co-located outputs."""
    monkeypatch.setenv("SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL", "0.2")
    expected = _colocated_outputs(colocated, PROMPTS[:4])
    p, d, port = _pair(colocated, {}, {})
    try:
        assert _serve_pair(p, d, port, PROMPTS[:4], 1100) == expected
        p.close()
        p = _prefill(colocated, port)  # the same address, a new process
        assert _serve_pair(p, d, port, PROMPTS[:4], 1200) == expected
        for core in (p, d):
            core.scheduler.check_memory_invariant()
    finally:
        p.close()
        d.close()
