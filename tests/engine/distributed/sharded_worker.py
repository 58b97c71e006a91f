"""The body of the 2-process sharded-layer test: each rank builds the TP layers from the same
full weights, runs them, and saves (sharded output, unsharded reference) pairs for rank 0's
parent to compare. Imported by spawned children, so it holds no test functions."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F

HIDDEN, INTER, VOCAB, HEAD_DIM = 64, 128, 251, 16  # 251: the vocab needs padding at tp=2


def run_rank(rank: int, world: int, port: int, out_dir: str) -> None:
    torch.set_num_threads(1)
    from radixserve.engine.distributed import (
        RankSpec,
        destroy_parallel_groups,
        init_parallel_groups,
    )

    spec = RankSpec(rank, world, port, ep_size=world)
    groups = init_parallel_groups(spec, torch.device("cpu"))
    try:
        results = _checks(groups.tp, Path(out_dir))
        results.update(_moe_checks(groups.ep))
        results["broadcast_bytes"] = _bytes_check(groups.cpu)
        results["min_int"] = (torch.tensor([groups.cpu.min_int(10 + rank)]), torch.tensor([10]))
    finally:
        destroy_parallel_groups(groups)
    torch.save(results, Path(out_dir) / f"rank{rank}.pt")


def _bytes_check(cpu: object) -> tuple[torch.Tensor, torch.Tensor]:
    from radixserve.engine.distributed import GroupHandle

    assert isinstance(cpu, GroupHandle)
    payload = b"requests of this round" if cpu.is_first else None
    got = cpu.broadcast_bytes(payload)
    empty = cpu.broadcast_bytes(b"" if cpu.is_first else None)
    ok = got == b"requests of this round" and empty == b""
    return torch.tensor([ok]), torch.tensor([True])


def _checks(tp: object, folder: Path) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    from radixserve.engine.distributed import GroupHandle
    from radixserve.engine.layers.parallel_linear import (
        ColumnParallelLinear,
        QKVParallelLinear,
        RowParallelLinear,
    )
    from radixserve.engine.layers.vocab_parallel import ParallelLMHead, VocabParallelEmbedding

    assert isinstance(tp, GroupHandle)
    gen = torch.Generator().manual_seed(0)  # same full weights on every rank

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen)

    x, h = randn(5, HIDDEN), randn(5, INTER)
    out: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    # fused gate/up: this rank's halves of gate and of up, side by side
    gate, up = randn(INTER, HIDDEN), randn(INTER, HIDDEN)
    col = ColumnParallelLinear(HIDDEN, [INTER, INTER], False, tp)
    col.load_shard(0, _lazy(folder, "gate", gate), False)  # read from safetensors, sliced
    col.load_shard(1, _lazy(folder, "up", up), False)
    n = INTER // tp.size
    rows = slice(tp.rank * n, (tp.rank + 1) * n)
    out["gate_up"] = (col(x), torch.cat([x @ gate[rows].T, x @ up[rows].T], dim=-1))
    # row-parallel with bias: the all-reduced sum equals the full matmul
    down, bias = randn(HIDDEN, INTER), randn(HIDDEN)
    row = RowParallelLinear(INTER, HIDDEN, True, tp)
    row.load_full(down, False)
    row.load_full(bias, True)
    local_h = h[:, tp.rank * n : (tp.rank + 1) * n]
    out["row"] = (row(local_h), F.linear(h, down, bias))
    for num_kv in (2, 1):  # KV heads split over 2 ranks, then one KV head replicated
        out[f"qkv_kv{num_kv}"] = _qkv(QKVParallelLinear, tp, x, num_kv, randn)
    emb_w, head_w = randn(VOCAB, HIDDEN), randn(VOCAB, HIDDEN)
    emb = VocabParallelEmbedding(VOCAB, HIDDEN, tp)
    emb.load_full(emb_w)
    ids = torch.tensor([0, 5, 125, 126, 200, 250])
    out["embedding"] = (emb(ids), F.embedding(ids, emb_w))
    head = ParallelLMHead(VOCAB, HIDDEN, tp, None)
    head.load_full(head_w)
    out["lm_head"] = (head(x), x @ head_w.T)
    tied = ParallelLMHead(VOCAB, HIDDEN, tp, emb)
    out["lm_head_tied"] = (tied(x), x @ emb_w.T)
    return out


def _moe_checks(ep: object) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """SparseMoeBlock with its experts split over the EP ranks, both dispatch modes, against
    one module holding all 8 experts (same weights, same router) — 7 tokens (uneven slices
    for all_to_all), 1 token (a rank with nothing to send) and none (an idle step)."""
    from radixserve.engine.configs.model_config import MoEConfig
    from radixserve.engine.distributed import GroupHandle
    from radixserve.engine.layers.moe import SparseMoeBlock

    assert isinstance(ep, GroupHandle)
    moe = MoEConfig(num_experts=8, top_k=2, moe_intermediate_size=32, norm_topk_prob=True)
    gen = torch.Generator().manual_seed(1)
    full = SparseMoeBlock(moe, HIDDEN)
    for p in full.parameters():
        p.data.copy_(torch.randn(p.shape, generator=gen) * 0.2)
    rng = slice(ep.rank * 8 // ep.size, (ep.rank + 1) * 8 // ep.size)
    out: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    for backend in ("none", "all_to_all"):
        block = SparseMoeBlock(moe, HIDDEN, ep=ep, a2a_backend=backend)
        block.gate.weight.data.copy_(full.gate.weight)
        block.experts.w13_weight.data.copy_(full.experts.w13_weight[rng])
        block.experts.w2_weight.data.copy_(full.experts.w2_weight[rng])
        for tokens in (7, 1, 0):
            x = torch.randn(tokens, HIDDEN, generator=gen)
            out[f"moe_{backend}_{tokens}"] = (block(x), full(x))
    return out


def _qkv(cls: type, tp: object, x: torch.Tensor, num_kv: int, randn: object) -> tuple:
    heads = 4
    wq, wk, wv = (
        randn(heads * HEAD_DIM, HIDDEN),
        randn(num_kv * HEAD_DIM, HIDDEN),
        randn(num_kv * HEAD_DIM, HIDDEN),
    )
    bq, bk, bv = randn(heads * HEAD_DIM), randn(num_kv * HEAD_DIM), randn(num_kv * HEAD_DIM)
    layer = cls(HIDDEN, HEAD_DIM, heads, num_kv, True, tp)
    for shard, (w, b) in enumerate(((wq, bq), (wk, bk), (wv, bv))):
        layer.load_shard(shard, w, False)
        layer.load_shard(shard, b, True)
    q_heads = heads // tp.size  # type: ignore[attr-defined]
    rank = tp.rank  # type: ignore[attr-defined]
    kv_head = rank * (num_kv // tp.size) if num_kv >= tp.size else rank // (tp.size // num_kv)  # type: ignore[attr-defined]
    kv_heads = max(1, num_kv // tp.size)  # type: ignore[attr-defined]
    q_rows = slice(rank * q_heads * HEAD_DIM, (rank + 1) * q_heads * HEAD_DIM)
    kv_rows = slice(kv_head * HEAD_DIM, (kv_head + kv_heads) * HEAD_DIM)
    want = torch.cat(
        [
            F.linear(x, w[r], b[r])
            for w, b, r in ((wq, bq, q_rows), (wk, bk, kv_rows), (wv, bv, kv_rows))
        ],
        dim=-1,
    )
    return layer(x), want


def _lazy(folder: Path, name: str, tensor: torch.Tensor) -> object:
    """Save `tensor` to safetensors and return a LazyWeight over it (a slice is read)."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    from radixserve.engine.model_loader.weight import LazyWeight

    path = folder / f"{name}.safetensors"
    if not path.exists():
        save_file({name: tensor.contiguous()}, str(path))
    f = safe_open(str(path), framework="pt")
    return LazyWeight(f.get_slice(name))
