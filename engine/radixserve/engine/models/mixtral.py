"""Mixtral (8x7B, 8x22B): the Llama decoder with every layer's MLP a routed-expert block,
named `block_sparse_moe` in checkpoints with experts' `w1` (gate), `w3` (up), `w2` (down).
Routing is top-k of the logits then a softmax over those k, computed as softmax → top-k →
renormalise (ModelConfig sets norm_topk_prob for Mixtral)."""

from __future__ import annotations

from radixserve.engine.models.moe_decoder import MoeForCausalLM


class MixtralForCausalLM(MoeForCausalLM):
    def checkpoint_name(self, name: str) -> str:
        """`model.layers.{i}.block_sparse_moe.…` lives at `model.layers.{i}.mlp.…` here."""
        return name.replace(".block_sparse_moe.", ".mlp.")
