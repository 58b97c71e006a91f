"""The bootstrap handshake's topology check, the control messages' wire form, and the plan of
which prefill rank writes which KV heads into which decode rank, checked by moving real bytes
(the `fake` backend's memmove) between pools of different TP sizes."""

from __future__ import annotations

import msgspec
import pytest
import torch

from radixserve.engine.disaggregation.kv_manager import (
    KVLayout,
    Target,
    TransferJob,
    batches_for,
    page_runs,
    plan_targets,
)
from radixserve.engine.disaggregation.transfer import FakeBackend
from radixserve.engine.disaggregation.wire import (
    KVDone,
    KVHeads,
    KVRequest,
    RankKV,
    ToDecode,
    Topology,
    ToPrefill,
    topology_mismatch,
)

BASE = Topology("LlamaForCausalLM", 30, 3, 64, 49152, "float32", 1, 1)


@pytest.mark.parametrize(
    ("field", "value", "what"),
    [
        ("architecture", "Qwen3ForCausalLM", "model"),
        ("num_layers", 24, "model"),
        ("num_kv_heads", 8, "model"),
        ("head_dim", 128, "model"),
        ("vocab_size", 32000, "model"),
        ("kv_dtype", "bfloat16", "kv_dtype"),
        ("page_size", 16, "page_size"),
    ],
)
def test_every_mismatch_is_refused_naming_both_sides(field: str, value: object, what: str) -> None:
    other = msgspec.structs.replace(BASE, **{field: value})
    message = topology_mismatch(other, BASE, "p-host:8998", "tcp://d-host:5000")
    assert message is not None
    assert f"mismatch ({what})" in message
    assert f"prefill p-host:8998 has {field}={value}" in message
    assert f"decode tcp://d-host:5000 has {field}={getattr(BASE, field)}" in message
    assert topology_mismatch(BASE, BASE, "p", "d") is None


def test_tp_sizes_may_differ() -> None:
    """Each side's ranks name their heads; the prefill re-slices them (tested below)."""
    tp2 = msgspec.structs.replace(BASE, tp_size=2)
    assert topology_mismatch(tp2, BASE, "p", "d") is None
    assert topology_mismatch(BASE, tp2, "p", "d") is None


def test_messages_round_trip_as_their_unions() -> None:
    rank = RankKV("d:2", KVHeads(0, 3), [100, 200], [300, 400], 384)
    request = KVRequest(7, "tcp://d:1", BASE, 16, [3, 4], [rank])
    done = KVDone(7, 42, -0.5, [(-0.5, 42)], 16, 2, 4096)
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(request), type=ToPrefill) == request
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(done), type=ToDecode) == done


def test_page_runs_and_the_backend_batch() -> None:
    assert page_runs([5, 6, 7, 9], [1, 2, 3, 4]) == [(5, 1, 3), (9, 4, 1)]
    layout = KVLayout((1000, 2000), (3000, 4000), item_len=8, page_size=4, buffer_len=4096)
    dst = RankKV("s", KVHeads(0, 1), [10000, 20000], [30000, 40000], 8)
    job = TransferJob(1, [5, 6, 9], [1, 2, 7], [Target(dst, 0, 0, 8)])
    [(session, src, dst_ptrs, lens)] = batches_for(job, layout)
    page = 8 * 4
    # whole rows: per layer, K then V: the run 5-6 -> 1-2 (two pages), then 9 -> 7
    assert session == "s"
    assert src[:2] == [1000 + 5 * page, 1000 + 9 * page]
    assert dst_ptrs[:2] == [10000 + 1 * page, 10000 + 7 * page]
    assert lens == [2 * page, page] * 4
    assert len(src) == len(dst_ptrs) == 4 * 2  # 2 layers x K/V x 2 runs


def _split(heads: int, tp: int) -> list[KVHeads]:
    """The engine's split (parallel_linear.kv_head_layout): even, or replicated when short."""
    if heads >= tp:
        return [KVHeads(r * heads // tp, heads // tp) for r in range(tp)]
    return [KVHeads(r // (tp // heads), 1) for r in range(tp)]


def test_each_decode_head_is_written_once_by_the_first_prefill_rank_holding_it() -> None:
    hb = 16
    # 2 heads over 4 prefill ranks (each replicated twice) → one decode rank with both
    prefill = _split(2, 4)
    decode = [RankKV("d", KVHeads(0, 2), [0], [0], 2 * hb)]
    plans = [plan_targets(r, prefill, decode, hb) for r in range(4)]
    assert [[(t.src_offset, t.dst_offset, t.length) for t in p] for p in plans] == [
        [(0, 0, hb)], [], [(0, hb, hb)], []
    ]  # fmt: skip
    # 4 heads, prefill tp1 → decode tp2: the one rank writes a half of its row to each
    decode = [RankKV(f"d{r}", h, [0], [0], 2 * hb) for r, h in enumerate(_split(4, 2))]
    [plan] = [plan_targets(0, _split(4, 1), decode, hb)]
    assert [(t.dst.session, t.src_offset, t.dst_offset, t.length) for t in plan] == [
        ("d0", 0, 0, 2 * hb), ("d1", 2 * hb, 0, 2 * hb)
    ]  # fmt: skip


def _pool(layers: int, slots: int, heads: int, dim: int) -> list[torch.Tensor]:
    return [torch.zeros(slots, heads, dim) for _ in range(2 * layers)]  # K per layer, then V


@pytest.mark.parametrize(
    ("num_heads", "p_tp", "d_tp"), [(4, 2, 1), (4, 1, 2), (2, 4, 2), (4, 2, 2)]
)
@pytest.mark.parametrize("page_size", [1, 4])
def test_heads_resliced_between_tp_sizes_move_the_same_kv(
    num_heads: int, p_tp: int, d_tp: int, page_size: int
) -> None:
    """The prefill's full KV (the reference: heads concatenated over its ranks) arrives whole
    in the decode's pages, sliced as the decode's ranks hold it."""
    layers, dim, slots = 2, 8, 6 * page_size
    gen = torch.Generator().manual_seed(0)
    full = [torch.randn(slots, num_heads, dim, generator=gen) for _ in range(2 * layers)]
    backend = FakeBackend()
    p_heads, d_heads = _split(num_heads, p_tp), _split(num_heads, d_tp)
    p_pools = [[t[:, h.first : h.first + h.count].clone() for t in full] for h in p_heads]
    d_pools = [_pool(layers, slots, h.count, dim) for h in d_heads]
    elem = full[0].element_size()

    def layout(pool: list[torch.Tensor], heads: KVHeads) -> KVLayout:
        ptrs = tuple(t.data_ptr() for t in pool)
        item = heads.count * dim * elem
        return KVLayout(ptrs[:layers], ptrs[layers:], item, page_size, slots * item, heads)

    decode = [
        layout(p, h).rank_kv(backend.session_id) for p, h in zip(d_pools, d_heads, strict=True)
    ]
    src_pages, dst_pages = [0, 1, 3], [5, 2, 3]
    moved = 0
    for rank, (pool, heads) in enumerate(zip(p_pools, p_heads, strict=True)):
        lay = layout(pool, heads)
        targets = plan_targets(rank, p_heads, decode, lay.head_bytes)
        for session, src, dst, lens in batches_for(
            TransferJob(1, src_pages, dst_pages, targets), lay
        ):
            assert backend.write(session, src, dst, lens) == 0
            moved += sum(lens)
    for pool, heads in zip(d_pools, d_heads, strict=True):
        for got, want in zip(pool, full, strict=True):
            for s, d in zip(src_pages, dst_pages, strict=True):
                rows = slice(d * page_size, (d + 1) * page_size)
                src_rows = slice(s * page_size, (s + 1) * page_size)
                assert torch.equal(
                    got[rows], want[src_rows, heads.first : heads.first + heads.count]
                )
    # every decode rank's rows of every moved page, once: what both sides count
    assert moved == len(src_pages) * page_size * 2 * layers * dim * elem * sum(
        h.count for h in d_heads
    )
