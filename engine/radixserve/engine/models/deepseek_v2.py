"""DeepSeek-V2 / V2-Lite / V3 (and R1, V3's architecture): the Llama-shaped decoder with MLA
attention (layers/mla_attention.py, a latent KV cache) and DeepSeek's MoE on the sparse layers.

- Attention: MLA with or without q_lora_rank (V2-Lite has none), YaRN rotary with mscale.
- MLP: dense (`intermediate_size`) on the first `first_k_dense_replace` layers (and where
  `moe_layer_freq` says), else routed experts plus `n_shared_experts` shared ones (one MLP of
  n_shared · moe_intermediate_size, ungated), routed with grouped top-k: V2's softmax with
  group_limited_greedy, V3's sigmoid with e_score_correction_bias (noaux_tc); weights scaled by
  routed_scaling_factor (layers/moe_router.py).
- V3 checkpoints hold a multi-token-prediction layer after the decoder's (`model.layers.{L}`,
  L = num_hidden_layers): radixserve has no speculative decoding to use it, so its tensors are
  skipped, with a log line saying so.

Loading follows MoeForCausalLM (experts stacked, EP slices); the attention's checkpoint names
map onto MLAAttention's modules (q_a_proj and kv_a_proj_with_mqa into the fused projection),
and kv_b_proj is absorbed into w_kc / w_vc once everything is in. Runs in the scheduler process.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Iterator

from torch import nn

from radixserve.engine.layers.mla_attention import MLAAttention
from radixserve.engine.layers.parallel_linear import ColumnParallelLinear, RowParallelLinear
from radixserve.engine.model_loader.weight import Weight
from radixserve.engine.models.llama import AttnFactory
from radixserve.engine.models.moe_decoder import MoeForCausalLM

logger = logging.getLogger(__name__)

_LAYER = re.compile(r"^model\.layers\.(\d+)\.")
_ATTN = re.compile(r"^(?P<attn>.+\.self_attn)\.(?P<proj>[a-z_]+)\.(?P<kind>weight|bias)$")
# checkpoint projection → (our module under self_attn, shard of it); the rest load whole
_FUSED_A = {"q_a_proj": 0, "kv_a_proj_with_mqa": 1}
_WHOLE = ("q_proj", "q_b_proj", "kv_b_proj", "o_proj", "kv_a_proj_with_mqa")


class DeepseekV2ForCausalLM(MoeForCausalLM):
    def attn_factory(self) -> AttnFactory:
        return MLAAttention

    def checkpoint_name(self, name: str) -> str:
        """`…mlp.shared_experts.…` (one MLP, n_shared wide) lives at `…mlp.shared_expert.…`."""
        return name.replace(".mlp.shared_experts.", ".mlp.shared_expert.")

    def load_weights(self, weights: Iterable[tuple[str, Weight]]) -> None:
        skipped: list[str] = []
        super().load_weights(self._without_mtp(weights, skipped))
        if skipped:
            layers = sorted({int(m[1]) for n in skipped if (m := _LAYER.match(n))})
            logger.info(
                "skipping DeepSeek MTP layer(s) %s (%d tensors): no speculative decoding uses "
                "them here",
                layers,
                len(skipped),
            )
        for module in self.modules():
            if isinstance(module, MLAAttention):
                module.absorb()

    def _without_mtp(
        self, weights: Iterable[tuple[str, Weight]], skipped: list[str]
    ) -> Iterator[tuple[str, Weight]]:
        """The checkpoint's tensors minus the layers past num_hidden_layers (MTP), unread."""
        last = self.config.num_hidden_layers
        for name, w in weights:
            if (m := _LAYER.match(name)) and int(m[1]) >= last:
                skipped.append(name)
                continue
            yield name, w

    def _load_one(self, params: dict[str, nn.Parameter], name: str, w: Weight) -> str:
        m = _ATTN.match(name)
        if m is None or m["proj"] not in (*_FUSED_A, *_WHOLE):
            return super()._load_one(params, name, w)
        attn = self.get_submodule(m["attn"])
        assert isinstance(attn, MLAAttention)
        is_bias = m["kind"] == "bias"
        fused = attn.fused_qkv_a_proj_with_mqa
        if fused is not None and m["proj"] in _FUSED_A:
            fused.load_shard(_FUSED_A[m["proj"]], w, is_bias)
            return f"{m['attn']}.fused_qkv_a_proj_with_mqa.{m['kind']}"
        module = getattr(attn, m["proj"], None)
        if not isinstance(module, (ColumnParallelLinear, RowParallelLinear)):
            raise ValueError(f"checkpoint tensor {name!r} has no place in {type(self).__name__}")
        module.load_full(w, is_bias)
        return name


class DeepseekV3ForCausalLM(DeepseekV2ForCausalLM):
    """V3 / R1: the same decoder; its config switches the routing to sigmoid + bias (noaux_tc)
    and its checkpoints add the MTP layer this class skips."""
