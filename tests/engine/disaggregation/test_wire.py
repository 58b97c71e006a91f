"""The bootstrap handshake's topology check and the control messages' wire form."""

from __future__ import annotations

import msgspec
import pytest

from radixserve.engine.disaggregation.kv_manager import KVLayout, TransferJob, batch_for, page_runs
from radixserve.engine.disaggregation.wire import (
    KVDone,
    KVRequest,
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
        ("tp_size", 2, "tp_size"),
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


def test_messages_round_trip_as_their_unions() -> None:
    request = KVRequest(7, "tcp://d:1", "d:2", BASE, 16, [3, 4], [100, 200], [300, 400])
    done = KVDone(7, 42, -0.5, [(-0.5, 42)], 16, 2, 4096)
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(request), type=ToPrefill) == request
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(done), type=ToDecode) == done


def test_page_runs_and_the_backend_batch() -> None:
    assert page_runs([5, 6, 7, 9], [1, 2, 3, 4]) == [(5, 1, 3), (9, 4, 1)]
    layout = KVLayout((1000, 2000), (3000, 4000), item_len=8, page_size=4, buffer_len=4096)
    job = TransferJob(1, "s", [5, 6, 9], [1, 2, 7], [10000, 20000], [30000, 40000])
    src, dst, lens = batch_for(job, layout)
    page = 8 * 4
    # per layer, K then V: the run 5-6 -> 1-2 (two pages), then 9 -> 7
    assert src[:2] == [1000 + 5 * page, 1000 + 9 * page]
    assert dst[:2] == [10000 + 1 * page, 10000 + 7 * page]
    assert lens == [2 * page, page] * 4
    assert len(src) == len(dst) == 4 * 2  # 2 layers x K/V x 2 runs
