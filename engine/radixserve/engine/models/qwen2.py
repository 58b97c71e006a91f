"""Qwen2: the Llama decoder with q/k/v biases (set by ModelConfig.attention_bias)."""

from __future__ import annotations

from radixserve.engine.models.llama import LlamaForCausalLM


class Qwen2ForCausalLM(LlamaForCausalLM):
    pass
