"""Fused MoE: top-k routing, block alignment and the grouped GEMMs against the expert loop."""

from __future__ import annotations

import pytest
import torch

from radixserve.kernels.layout import TopKOutput, moe_align_block_size
from radixserve.kernels.moe import fused_moe, grouped_gemm, topk_softmax
from radixserve.kernels.reference import fused_moe_ref, grouped_gemm_ref, topk_softmax_ref
from tests.kernels.cases import DEVICES, DTYPES, assert_close, poisoned, randn

# (num_tokens, num_experts, hidden, inter, top_k): many tokens, decode-sized, idle experts.
SHAPES = {
    "cpu": [(13, 6, 32, 48, 2), (1, 4, 16, 16, 1), (3, 8, 32, 24, 2)],
    "cuda": [(256, 64, 1024, 512, 8), (3, 8, 4096, 1408, 2), (2048, 16, 2048, 1408, 4)],
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("renormalize", [False, True])
def test_topk_softmax_matches_reference(
    device: str, dtype: torch.dtype, renormalize: bool, gen: torch.Generator
) -> None:
    num_tokens, num_experts, top_k = (9, 6, 2) if device == "cpu" else (1000, 64, 8)
    logits = randn(gen, num_tokens, num_experts, dtype=dtype, device=device)
    out = TopKOutput(
        poisoned(num_tokens, top_k, dtype=torch.float32, device=device),
        torch.full((num_tokens, top_k), -1, dtype=torch.int32, device=device),
    )
    got = topk_softmax(logits, top_k, renormalize, out=out)
    assert got is out and (got.ids >= 0).all()
    want = topk_softmax_ref(logits, top_k, renormalize)
    assert got.ids.dtype == torch.int32 and got.weights.dtype == torch.float32
    assert_close(got.weights, want.weights, torch.float32)
    # Ties (likely in bf16) may pick either expert: the chosen ones must carry the same weight.
    probs = torch.softmax(logits.float(), -1)
    picked = probs.gather(1, got.ids.long())
    if renormalize:
        picked = picked / picked.sum(-1, keepdim=True)
    assert_close(picked, want.weights, torch.float32)
    assert (got.ids.sort(1).values.diff(dim=1) != 0).all(), "an expert was picked twice"


@pytest.mark.parametrize("block_m", [1, 4, 16])
def test_align_sorts_and_pads_rows_per_expert(block_m: int, gen: torch.Generator) -> None:
    num_tokens, num_experts, top_k = 11, 5, 3
    ids = torch.stack([torch.randperm(num_experts, generator=gen)[:top_k] for _ in range(11)])
    routing = moe_align_block_size(ids.to(torch.int32), num_experts, block_m)
    num_rows = num_tokens * top_k
    blocks = routing.sorted_ids.view(-1, block_m)
    assert blocks.shape[0] == routing.expert_ids.shape[0]
    real = routing.sorted_ids[routing.sorted_ids < num_rows]
    assert sorted(real.tolist()) == list(range(num_rows)), "every row exactly once"
    flat = ids.flatten()
    used = routing.expert_ids[routing.expert_ids >= 0]
    assert used.tolist() == sorted(used.tolist()), "experts in order"
    for block, expert in zip(blocks, routing.expert_ids.tolist(), strict=True):
        rows = block[block < num_rows].long()
        if expert < 0:
            assert rows.numel() == 0, "spare blocks hold only padding"
        else:
            assert rows.numel() > 0 and (flat[rows] == expert).all(), "one expert per block"
    counts = torch.bincount(flat, minlength=num_experts)
    assert len(used) == int(((counts + block_m - 1) // block_m).sum())


def _weights(gen: torch.Generator, shape: tuple[int, int, int, int, int], dtype: torch.dtype,
             device: str) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """w13 [E, 2I, H] and w2 [E, H, I], scaled so every product stays O(1)."""
    _, num_experts, hidden, inter, _ = shape
    w13 = randn(gen, num_experts, 2 * inter, hidden, dtype=torch.float32, device=device)
    w2 = randn(gen, num_experts, hidden, inter, dtype=torch.float32, device=device)
    return (w13 * hidden**-0.5).to(dtype), (w2 * inter**-0.5).to(dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("weighted", [False, True])
def test_grouped_gemm_writes_every_routed_row(
    device: str, dtype: torch.dtype, weighted: bool, gen: torch.Generator
) -> None:
    shape = SHAPES[device][0]
    num_tokens, num_experts, hidden, inter, top_k = shape
    w13, _ = _weights(gen, shape, dtype, device)
    x = randn(gen, num_tokens, hidden, dtype=dtype, device=device)
    logits = randn(gen, num_tokens, num_experts, dtype=torch.float32, device=device)
    topk = topk_softmax_ref(logits, top_k, renormalize=False)
    routing = moe_align_block_size(topk.ids, num_experts, 16)
    row_weights = topk.weights.flatten() if weighted else None
    out = poisoned(num_tokens * top_k, 2 * inter, dtype=dtype, device=device)
    got = grouped_gemm(x, w13, out, routing, a_row_div=top_k, row_weights=row_weights)
    want = grouped_gemm_ref(x, w13, poisoned(*out.shape, dtype=dtype, device=device), routing,
                            a_row_div=top_k, row_weights=row_weights)  # fmt: skip
    assert got is out
    assert_close(out, want, dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", range(3), ids=["many-tokens", "decode", "idle-experts"])
def test_fused_moe_matches_the_expert_loop(
    device: str, dtype: torch.dtype, shape: int, gen: torch.Generator
) -> None:
    num_tokens, num_experts, hidden, inter, top_k = SHAPES[device][shape]
    x = randn(gen, num_tokens, hidden, dtype=dtype, device=device)
    w13, w2 = _weights(gen, SHAPES[device][shape], dtype, device)
    logits = randn(gen, num_tokens, num_experts, dtype=torch.float32, device=device)
    topk = topk_softmax_ref(logits, top_k, renormalize=True)
    got = fused_moe(x, w13, w2, topk)
    assert got.shape == x.shape and got.dtype == dtype
    assert_close(got, fused_moe_ref(x, w13, w2, topk), dtype)
