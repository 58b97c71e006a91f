"""Qwen2-MoE (Qwen1.5-MoE-A2.7B, Qwen2-57B-A14B): Qwen2's attention (q/k/v biases) with routed
experts plus a shared expert scaled by sigmoid(shared_expert_gate(x)) on every sparse layer
(`shared_expert_intermediate_size` in ModelConfig.moe); dense MLP on `mlp_only_layers`."""

from __future__ import annotations

from radixserve.engine.models.moe_decoder import MoeForCausalLM


class Qwen2MoeForCausalLM(MoeForCausalLM):
    pass
