"""Golden KV-event payloads of SGLang 0.5.6, SGLang 0.5.23 and vLLM 0.32 (captured with their
own msgspec structs, see tests/fixtures/make_kv_event_golden.py) decode to what they mean, and
what our engine publishes decodes with the map-format engines' structs."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import msgspec
import pytest

from radixserve.protocol import AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch
from radixserve.protocol.kv_events import decode_batch, encode_batch
from tests.child_env import child_env

FIXTURES = Path(__file__).parents[1] / "fixtures"
GENERATOR = FIXTURES / "make_kv_event_golden.py"
GOLDEN = json.loads((FIXTURES / "kv_event_golden.json").read_text())


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("make_kv_event_golden", GENERATOR)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, module)  # msgspec resolves annotations through it
    spec.loader.exec_module(sys.modules[spec.name])
    return sys.modules[spec.name]


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_each_engines_payload_decodes_to_its_meaning(name: str) -> None:
    batch = decode_batch((FIXTURES / "kv_events" / f"{name}.msgpack").read_bytes())
    assert msgspec.to_builtins(batch) == [
        GOLDEN[name]["ts"],
        GOLDEN[name]["events"],
        GOLDEN[name]["attn_dp_rank"],
    ]
    assert [type(e) for e in batch.events] == [
        BlockStored,
        BlockStored,
        BlockRemoved,
        AllBlocksCleared,
    ]
    first, second = batch.events[0], batch.events[1]
    assert isinstance(first, BlockStored) and isinstance(second, BlockStored)
    assert second.parent_block_hash == first.block_hashes[0]  # bytes hashes chain alike


def test_fixtures_have_not_drifted() -> None:
    done = subprocess.run(
        [sys.executable, str(GENERATOR), "--check"],
        capture_output=True,
        text=True,
        timeout=60,
        env=child_env(),
    )
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("engine", ["sglang-0.5.23", "vllm-0.32"])
def test_our_default_output_decodes_with_the_map_format_engines_structs(engine: str) -> None:
    theirs = _generator().DESCRIBED[engine]()
    ours = KVEventBatch(
        2.5,
        [BlockStored([11], None, [1, 2], 2), BlockStored([12], 11, [3, 4], 2), BlockRemoved([12])],
        0,
    )
    got = msgspec.msgpack.Decoder(theirs.KVEventBatch).decode(encode_batch(ours))
    kinds = [theirs.BlockStored, theirs.BlockStored, theirs.BlockRemoved]
    assert [type(e) for e in got.events] == kinds
    assert (got.events[1].block_hashes, got.events[1].parent_block_hash) == ([12], 11)
    assert got.events[1].token_ids == [3, 4] and got.events[2].block_hashes == [12]


def test_the_array_format_decodes_with_sglang_056s_structs_and_not_the_maps() -> None:
    old = _generator().DESCRIBED["sglang-0.5.6"]()
    batch = KVEventBatch(1.0, [BlockStored([5], None, [9], 1), AllBlocksCleared()], 0)
    got = msgspec.msgpack.Decoder(old.KVEventBatch).decode(encode_batch(batch, "array"))
    assert got.events[0].block_hashes == [5] and got.events[0].token_ids == [9]
    with pytest.raises(msgspec.ValidationError, match="Expected `array`, got `object`"):
        msgspec.msgpack.Decoder(old.KVEventBatch).decode(encode_batch(batch))
