"""layers.moe against a dense per-token loop: each token is the sum over its top-k choices of
router weight × that expert's SiLU-gated MLP, with the experts kept as separate HF-shaped
gate / up / down matrices (so the stacked w13 / w2 layout and its loading are checked too)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from radixserve.engine.configs.model_config import MoEConfig
from radixserve.engine.layers.moe import (
    ExpertRange,
    FusedMoE,
    SparseMoeBlock,
    TopKOutput,
    select_experts,
)

E, H, INTER, TOP_K = 8, 64, 32, 2


def random_experts(seed: int) -> list[dict[str, torch.Tensor]]:
    """Per-expert gate (w1) [I, H], up (w3) [I, H], down (w2) [H, I], as checkpoints hold them."""
    gen = torch.Generator().manual_seed(seed)
    shapes = {"w1": (INTER, H), "w3": (INTER, H), "w2": (H, INTER)}
    return [{k: 0.2 * torch.randn(s, generator=gen) for k, s in shapes.items()} for _ in range(E)]


def build(experts: list[dict[str, torch.Tensor]], rng: ExpertRange | None = None) -> FusedMoE:
    moe = FusedMoE(E, H, INTER, rng)
    for e, mats in enumerate(experts):
        for shard, w in mats.items():
            assert moe.load_expert(e, shard, w) is moe.expert_range.holds(e)  # type: ignore[arg-type]
    return moe


def per_token_reference(
    x: torch.Tensor, topk: TopKOutput, experts: list[dict[str, torch.Tensor]], held: range
) -> torch.Tensor:
    """Token by token, choice by choice; choices of experts outside `held` add nothing."""
    out = torch.zeros_like(x)
    for t in range(x.shape[0]):
        for j in range(topk.ids.shape[1]):
            e = int(topk.ids[t, j])
            if e not in held:
                continue
            m = experts[e]
            y = (F.silu(x[t] @ m["w1"].T) * (x[t] @ m["w3"].T)) @ m["w2"].T
            out[t] += topk.weights[t, j] * y
    return out


# Uneven loads: expert 0 takes 6 of 14 choices, expert 3 takes one, experts 5 and 7 none.
SKEWED_IDS = [[0, 1], [0, 2], [1, 0], [0, 3], [2, 0], [0, 6], [6, 4]]


def skewed_topk(seed: int) -> TopKOutput:
    gen = torch.Generator().manual_seed(seed)
    ids = torch.tensor(SKEWED_IDS)
    weights = torch.rand(ids.shape, generator=gen) + 0.1
    return TopKOutput(weights, ids)


def test_uneven_loads_and_idle_experts_match_the_per_token_loop() -> None:
    experts = random_experts(0)
    topk = skewed_topk(1)
    counts = torch.bincount(topk.ids.reshape(-1), minlength=E)
    assert counts[0] == 6 and counts[3] == 1 and counts[5] == counts[7] == 0
    x = torch.randn(len(SKEWED_IDS), H, generator=torch.Generator().manual_seed(2))
    ours = build(experts)(x, topk)
    ref = per_token_reference(x, topk, experts, range(E))
    torch.testing.assert_close(ours, ref, atol=1e-5, rtol=1e-5)


def test_routed_batch_matches_the_per_token_loop() -> None:
    """Router-chosen top-2 over 50 tokens (every expert of some load, distinct per token)."""
    experts = random_experts(3)
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(50, H, generator=gen)
    topk = select_experts(torch.randn(50, E, generator=gen), TOP_K, renormalize=True)
    assert all(len(set(row)) == TOP_K for row in topk.ids.tolist())
    ours = build(experts)(x, topk)
    torch.testing.assert_close(ours, per_token_reference(x, topk, experts, range(E)))


def test_expert_ranges_hold_their_share_and_sum_to_the_whole() -> None:
    """Expert parallelism's contract: each range computes only its experts' share."""
    experts = random_experts(5)
    x = torch.randn(len(SKEWED_IDS), H, generator=torch.Generator().manual_seed(6))
    topk = skewed_topk(7)
    low, high = build(experts, ExpertRange(0, 4)), build(experts, ExpertRange(4, 8))
    assert low.w13_weight.shape == (4, 2 * INTER, H) and high.w2_weight.shape == (4, H, INTER)
    torch.testing.assert_close(low(x, topk), per_token_reference(x, topk, experts, range(0, 4)))
    torch.testing.assert_close(low(x, topk) + high(x, topk), build(experts)(x, topk))


def test_an_empty_batch_gives_an_empty_output() -> None:
    topk = TopKOutput(torch.empty(0, TOP_K), torch.empty(0, TOP_K, dtype=torch.int64))
    assert build(random_experts(8))(torch.empty(0, H), topk).shape == (0, H)


def test_softmax_topk_renormalise_equals_softmax_over_the_topk_logits() -> None:
    """Mixtral's routing (top-k logits, softmax over k) is Qwen's with renormalisation."""
    logits = torch.randn(20, E, generator=torch.Generator().manual_seed(9))
    renorm = select_experts(logits, TOP_K, renormalize=True)
    top_logits, top_ids = torch.topk(logits, TOP_K, dim=-1)
    assert torch.equal(renorm.ids, top_ids)
    torch.testing.assert_close(renorm.weights, torch.softmax(top_logits, dim=-1))
    plain = select_experts(logits, TOP_K, renormalize=False)
    torch.testing.assert_close(plain.weights, torch.softmax(logits, -1).gather(1, top_ids))
    assert renorm.weights.dtype == torch.float32


def test_shared_expert_is_added_under_its_sigmoid_gate() -> None:
    moe = MoEConfig(E, TOP_K, INTER, norm_topk_prob=False, shared_expert_intermediate_size=48)
    shared = torch.nn.Linear(H, H, bias=False)
    block = SparseMoeBlock(moe, H, shared_expert=shared)
    gen = torch.Generator().manual_seed(10)
    with torch.no_grad():
        for p in block.parameters():
            p.copy_(0.2 * torch.randn(p.shape, generator=gen))
    x = torch.randn(9, H, generator=gen)
    topk = select_experts(block.gate(x), TOP_K, renormalize=False)
    assert block.shared_expert_gate is not None
    want = block.experts(x, topk) + torch.sigmoid(block.shared_expert_gate(x)) * shared(x)
    torch.testing.assert_close(block(x), want)


def test_loading_checks_shapes_and_ranges() -> None:
    moe = FusedMoE(E, H, INTER, ExpertRange(2, 4))
    assert not moe.load_expert(5, "w1", torch.zeros(INTER, H))
    with pytest.raises(ValueError, match="expert 2 w2"):
        moe.load_expert(2, "w2", torch.zeros(INTER, H))
    with pytest.raises(ValueError, match="not inside"):
        FusedMoE(E, H, INTER, ExpertRange(6, 9))


def test_sparse_layers_follow_decoder_sparse_step_and_mlp_only_layers() -> None:
    moe = MoEConfig(E, TOP_K, INTER, True, decoder_sparse_step=2, mlp_only_layers=(3,))
    assert [moe.is_sparse_layer(i) for i in range(6)] == [False, True, False, False, False, True]
