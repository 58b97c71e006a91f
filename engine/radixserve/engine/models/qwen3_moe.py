"""Qwen3-MoE (Qwen3-30B-A3B, Qwen3-235B-A22B): Qwen3's attention (per-head q/k RMSNorm, no
biases) with a routed-expert MLP on the sparse layers and the dense MLP on `mlp_only_layers`;
softmax → top-k, renormalised when `norm_topk_prob`; no shared expert."""

from __future__ import annotations

from radixserve.engine.models.moe_decoder import MoeForCausalLM


class Qwen3MoeForCausalLM(MoeForCausalLM):
    pass
