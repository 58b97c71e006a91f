"""DP attention's groups and collectives in four real processes joined by gloo (world 4, dp 2,
so two attention-TP groups of 2): the group layout each rank sees; `dp_gather` building every
DP rank's tokens in DP rank order on every rank in both padding modes (sum-of-lengths all-reduce,
max-length all-gather) and `dp_scatter` giving each rank back its own DP rank's rows; and the
per-step token-count exchange (`DpAttentionSync`), with one DP rank idle, then all idle."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tests.engine.distributed import dp_attention_worker as worker
from tests.ports import free_port


def _entry(rank: int, port: int, out: str) -> None:
    worker.run_rank(rank, port, out)


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    import torch.multiprocessing as tmp

    out = tmp_path_factory.mktemp("dpattn")
    tmp.start_processes(
        _entry, args=(free_port(), str(out)), nprocs=worker.WORLD, start_method="spawn"
    )
    return [torch.load(out / f"rank{r}.pt") for r in range(worker.WORLD)]


def test_group_layout(results: list[dict[str, Any]]) -> None:
    assert [r["spec"] for r in results] == [(0, True), (0, False), (1, True), (1, False)]
    layout = [r["groups"] for r in results]
    assert [g["tp"] for g in layout] == [(r, 4) for r in range(4)]  # MLPs: the whole world
    assert [g["attn_tp"] for g in layout] == [(0, 2), (1, 2), (0, 2), (1, 2)]
    assert [g["attn_dp"] for g in layout] == [(0, 2), (0, 2), (1, 2), (1, 2)]
    assert [g["attn_cpu"] for g in layout] == [g["attn_tp"] for g in layout]
    assert [g["ep"] for g in layout] == [(0, 2), (1, 2), (0, 2), (1, 2)]
    assert [r["attn_tp_sum"] for r in results] == [1, 1, 5, 5]  # ranks {0,1} and {2,3}


@pytest.mark.parametrize("mode", ["sum_len", "max_len"])
def test_gather_then_scatter(results: list[dict[str, Any]], mode: str) -> None:
    every = torch.cat([worker.dp_tokens(d) for d in range(worker.DP)])
    for rank, r in enumerate(results):
        assert torch.equal(r[f"gather_{mode}"], every), rank
        assert torch.equal(r[f"scatter_{mode}"], worker.dp_tokens(rank // 2)), rank


def test_token_counts_are_exchanged(results: list[dict[str, Any]]) -> None:
    for r in results:
        # DP rank 0 idle, DP rank 1 decoding 7 tokens: rank 0 must join (an IDLE forward)
        assert r["exchange_one_idle"] == ((0, 7), "max_len", True)
        assert r["exchange_all_idle"] == (None, False)  # nobody runs a forward
