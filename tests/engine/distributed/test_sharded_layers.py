"""Tensor-parallel layers at tp=2 against the unsharded math, in two real processes joined by
gloo: fused gate/up and q/k/v column shards (KV heads split and replicated), row-parallel
all-reduce with bias, vocab-parallel embedding and LM head (padded vocab, tied and untied),
plus the CPU group's byte broadcast and int minimum, and the MoE block with its 8 experts split
over the 2 EP ranks in both dispatch modes (none, all_to_all) against one module holding all of
them. One pair of processes runs every check."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.engine.distributed import sharded_worker
from tests.ports import free_port

CHECKS = (
    "gate_up",
    "row",
    "qkv_kv2",
    "qkv_kv1",
    "embedding",
    "lm_head",
    "lm_head_tied",
    "broadcast_bytes",
    "min_int",
    *(f"moe_{mode}_{n}" for mode in ("none", "all_to_all") for n in (7, 1, 0)),
)


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, tuple]]:
    import torch.multiprocessing as tmp

    out = tmp_path_factory.mktemp("tp2")
    port = free_port()
    tmp.start_processes(_entry, args=(2, port, str(out)), nprocs=2, start_method="spawn")
    return [torch.load(out / f"rank{r}.pt") for r in range(2)]


def _entry(rank: int, world: int, port: int, out: str) -> None:
    sharded_worker.run_rank(rank, world, port, out)


@pytest.mark.parametrize("check", CHECKS)
def test_sharded_layer_matches_unsharded(results: list[dict[str, tuple]], check: str) -> None:
    for rank, per_rank in enumerate(results):
        got, want = per_rank[check]
        assert got.shape == want.shape, f"rank {rank}"
        torch.testing.assert_close(got.float(), want.float(), rtol=1e-5, atol=1e-5)


def test_kv_head_layout_splits_or_replicates() -> None:
    from radixserve.engine.distributed import GroupHandle
    from radixserve.engine.layers.parallel_linear import kv_head_layout

    def layout(kv: int, rank: int, size: int) -> tuple[int, int]:
        lay = kv_head_layout(kv, GroupHandle(rank, size))
        return lay.num_local_heads, lay.first_head

    assert [layout(8, r, 4) for r in range(4)] == [(2, 0), (2, 2), (2, 4), (2, 6)]
    assert [layout(2, r, 4) for r in range(4)] == [(1, 0), (1, 0), (1, 1), (1, 1)]
    assert [layout(1, r, 2) for r in range(2)] == [(1, 0), (1, 0)]


def test_lazy_weight_reads_only_a_slice(tmp_path: Path) -> None:
    from tests.engine.distributed.sharded_worker import _lazy

    full = torch.arange(24.0).reshape(4, 6)
    lazy = _lazy(tmp_path, "w", full)
    assert lazy.shape == (4, 6)  # type: ignore[attr-defined]
    assert torch.equal(lazy.narrow(1, 2, 3), full[:, 2:5])  # type: ignore[attr-defined]
    assert torch.equal(lazy.full(), full)  # type: ignore[attr-defined]
