"""The body of the 4-process DP-attention test (world 4, dp 2, attention-TP 2): each rank builds
the groups, gathers and scatters its DP rank's tokens in both padding modes, exchanges step
token counts with `DpAttentionSync` (one DP rank idle in one round), and saves what it saw for
the parent to compare. Imported by spawned children, so it holds no test functions."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

WORLD, DP, HIDDEN = 4, 2, 8
TOKENS = (3, 5)  # per DP rank


def dp_tokens(dp_rank: int) -> torch.Tensor:
    """The hidden states DP rank `dp_rank`'s attention produced (the same on its TP ranks)."""
    gen = torch.Generator().manual_seed(100 + dp_rank)
    return torch.randn(TOKENS[dp_rank], HIDDEN, generator=gen)


def run_rank(rank: int, port: int, out_dir: str) -> None:
    torch.set_num_threads(1)
    from radixserve.engine.distributed import (
        RankSpec,
        destroy_parallel_groups,
        init_parallel_groups,
    )
    from radixserve.engine.forward_batch import DpAttentionMeta, ForwardMode
    from radixserve.engine.layers.dp_attention import dp_gather, dp_scatter
    from radixserve.engine.scheduler.dp_attention_sync import DpAttentionSync
    from radixserve.engine.scheduler.schedule_batch import ScheduleBatch

    spec = RankSpec(rank, WORLD, port, ep_size=2, attn_dp_size=DP)
    groups = init_parallel_groups(spec, torch.device("cpu"))
    out: dict[str, Any] = {"spec": (spec.dp_rank, spec.is_first)}
    try:
        g = groups
        out["groups"] = {
            name: (h.rank, h.size)
            for name, h in (("tp", g.tp), ("attn_tp", g.attn_tp), ("attn_dp", g.attn_dp),
                            ("ep", g.ep), ("cpu", g.cpu), ("attn_cpu", g.attn_cpu))
        }  # fmt: skip
        # the attention-TP group really is this DP rank's pair: a sum over it
        out["attn_tp_sum"] = int(g.attn_tp.all_reduce(torch.tensor([rank])).item())
        mine = dp_tokens(spec.dp_rank)
        for mode in ("sum_len", "max_len"):
            meta = DpAttentionMeta(spec.dp_rank, TOKENS, mode)  # type: ignore[arg-type]
            gathered = dp_gather(mine, meta, groups)
            out[f"gather_{mode}"] = gathered
            out[f"scatter_{mode}"] = dp_scatter(gathered, meta)
        sync = DpAttentionSync(groups)
        decode = ScheduleBatch([], None, ForwardMode.DECODE, input_ids=[1] * 7)  # type: ignore[arg-type]
        batch = None if spec.dp_rank == 0 else decode
        meta = sync.exchange(batch)
        out["exchange_one_idle"] = (meta.num_tokens, meta.mode, sync.busy) if meta else None
        out["exchange_all_idle"] = (sync.exchange(None), sync.busy)
    finally:
        destroy_parallel_groups(groups)
    torch.save(out, Path(out_dir) / f"rank{rank}.pt")
