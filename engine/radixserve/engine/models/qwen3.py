"""Qwen3 (dense): the Llama decoder with per-head q/k RMSNorm before rotary
(set by ModelConfig.qk_norm); no q/k/v biases unless the config asks for them."""

from __future__ import annotations

from radixserve.engine.models.llama import LlamaForCausalLM


class Qwen3ForCausalLM(LlamaForCausalLM):
    pass
