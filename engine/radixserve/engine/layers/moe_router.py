"""The MoE router (`MoEGate`: logits, then the experts each token goes to, with their weights)
and the routing rules of the supported MoE models, as `MoEConfig` describes them.

- Plain (Qwen-MoE, Mixtral): softmax over the experts, top-k, renormalised when asked
  (`moe.select_experts`).
- Grouped softmax (DeepSeek-V2, `group_limited_greedy`): the experts form n_group groups, a
  group scores its best expert's probability, only the best topk_group groups' experts are
  candidates; the weights are the probabilities of the chosen ones.
- Biased grouped sigmoid (DeepSeek-V3, `noaux_tc`): scores are sigmoid(logits); the choice uses
  scores + e_score_correction_bias (a group scores the sum of its two best biased scores), the
  weights are the unbiased scores of the chosen experts.

Then, for all: renormalise to sum 1 when norm_topk_prob (V3: plus 1e-20, as the reference), and
multiply by routed_scaling_factor (folding it into the weights scales the routed output once,
before the shared expert is added). Logits and weights are float32; DeepSeek's logits are
computed in float32 too (its router weight is float32 in the checkpoints, `keep_float32`).
Runs inside the model's forward in the scheduler process.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from radixserve.engine.configs.model_config import MoEConfig


class TopKOutput(NamedTuple):
    """The router's choice per token."""

    weights: torch.Tensor  # [T, top_k] float32
    ids: torch.Tensor  # [T, top_k] int64, global expert ids, distinct per row


def select_experts(router_logits: torch.Tensor, top_k: int, renormalize: bool) -> TopKOutput:
    """Softmax over experts (float32), then the top_k largest, renormalised to sum 1 when asked.

    router_logits: [T, E]. Qwen-MoE renormalises when `norm_topk_prob`; Mixtral's "top-k of the
    logits, then softmax over those k" is the same as softmax -> top-k -> renormalise.
    """
    probs = torch.softmax(router_logits.float(), dim=-1)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return TopKOutput(weights, ids)


def _group_mask(group_scores: torch.Tensor, topk_group: int, num_experts: int) -> torch.Tensor:
    """[T, n_group] group scores → bool [T, E]: experts of the best topk_group groups."""
    t, n_group = group_scores.shape
    best = torch.topk(group_scores, k=topk_group, dim=-1, sorted=False).indices
    keep = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, best, True)
    return keep.unsqueeze(-1).expand(t, n_group, num_experts // n_group).reshape(t, num_experts)


def grouped_topk(logits: torch.Tensor, moe: MoEConfig) -> TopKOutput:
    """DeepSeek-V2's group-limited greedy routing (softmax; group score = its max)."""
    scores = torch.softmax(logits.float(), dim=-1)
    t, e = scores.shape
    group_scores = scores.view(t, moe.n_group, e // moe.n_group).amax(dim=-1)
    masked = scores.masked_fill(~_group_mask(group_scores, moe.topk_group, e), 0.0)
    weights, ids = torch.topk(masked, k=moe.top_k, dim=-1, sorted=False)
    if moe.norm_topk_prob:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return TopKOutput(weights, ids)


def biased_grouped_topk(
    logits: torch.Tensor, moe: MoEConfig, bias: torch.Tensor | None
) -> TopKOutput:
    """DeepSeek-V3's routing (sigmoid; the bias and the top-2 group sums only choose)."""
    scores = torch.sigmoid(logits.float())
    choice = scores + bias.float() if bias is not None else scores
    t, e = scores.shape
    group_scores = choice.view(t, moe.n_group, e // moe.n_group).topk(2, dim=-1).values.sum(-1)
    choice = choice.masked_fill(~_group_mask(group_scores, moe.topk_group, e), float("-inf"))
    ids = torch.topk(choice, k=moe.top_k, dim=-1, sorted=False).indices
    weights = scores.gather(1, ids)
    if moe.norm_topk_prob:
        weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
    return TopKOutput(weights, ids)


def route(logits: torch.Tensor, moe: MoEConfig, bias: torch.Tensor | None) -> TopKOutput:
    """logits [T, E] → each token's top_k experts (logical ids) and float32 weights."""
    if moe.scoring_func == "sigmoid":
        topk = biased_grouped_topk(logits, moe, bias)
    elif moe.scoring_func != "softmax":
        raise ValueError(f"MoE scoring_func {moe.scoring_func!r} is not supported")
    elif moe.n_group > 1:
        topk = grouped_topk(logits, moe)
    else:
        topk = select_experts(logits, moe.top_k, moe.norm_topk_prob)
    if moe.routed_scaling_factor != 1.0:
        topk = TopKOutput(topk.weights * moe.routed_scaling_factor, topk.ids)
    return topk


class MoEGate(nn.Module):
    """The router: `weight` [E, H] (checkpoint `…mlp.gate.weight`) and, for V3, the
    `e_score_correction_bias` [E]. forward → logits [T, E]; `route` → TopKOutput."""

    def __init__(self, moe: MoEConfig, hidden_size: int) -> None:
        super().__init__()
        self.moe = moe
        self.weight = nn.Parameter(torch.empty(moe.num_experts, hidden_size), requires_grad=False)
        self.e_score_correction_bias = (
            nn.Parameter(torch.zeros(moe.num_experts), requires_grad=False)
            if moe.correction_bias
            else None
        )
        # DeepSeek's router stays float32 whatever the model dtype (ModelRunner honours this):
        # its logits pick among 64-256 experts with a learned bias of similar magnitude.
        self.keep_float32 = not moe.plain_routing

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.keep_float32:
            return F.linear(hidden.float(), self.weight.float())
        return F.linear(hidden, self.weight)

    def route(self, hidden: torch.Tensor) -> TopKOutput:
        return route(self(hidden), self.moe, self.e_score_correction_bias)
