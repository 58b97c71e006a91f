"""EAGLE draft head for Llama targets (`LlamaForCausalLMEagle`, SGLang's name; EAGLE-1/2).

One decoder layer that reads, for each position, the next token's embedding beside the target's
final hidden state there: fc([embed(x_{i+1}), f_i]) → layer → g_i, whose LM-head logits
predict x_{i+2}; drafting further, g_i stands in for f_{i+1}. The first layer has no input
norm and the head no final norm (EAGLE's layout). The embedding and the LM head are the
target's (`share_embed_and_head`) unless the checkpoint carries its own.

Checkpoint names are EAGLE's: `fc.weight` / `fc.bias`, `layers.0.…` (no `model.` prefix),
optionally `embed_tokens.weight` and `lm_head.weight`.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from radixserve.engine.configs.model_config import ModelConfig
from radixserve.engine.distributed import ParallelGroups
from radixserve.engine.forward_batch import ForwardBatch
from radixserve.engine.layers.logits_processor import LogitsProcessor, LogitsProcessorOutput
from radixserve.engine.layers.rotary_embedding import RotaryEmbedding
from radixserve.engine.layers.vocab_parallel import ParallelLMHead, VocabParallelEmbedding
from radixserve.engine.model_loader.weight import Weight, read_full, weight_shape
from radixserve.engine.models.base import CausalLM
from radixserve.engine.models.llama import LlamaDecoderLayer, load_tensor


class LlamaForCausalLMEagle(CausalLM):
    def __init__(self, config: ModelConfig, groups: ParallelGroups | None = None) -> None:
        super().__init__()
        self.config = config
        groups = groups or ParallelGroups.single()
        h = config.hidden_size
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, h, groups.attn_tp)
        self.fc = nn.Linear(2 * h, h, bias=True)
        self.layers = nn.ModuleList([LlamaDecoderLayer(config, 0, groups)])
        c = config
        self.rotary_emb = RotaryEmbedding(
            c.head_dim, c.max_position_embeddings, c.rope_theta, c.rope_scaling
        )
        self.lm_head = ParallelLMHead(config.vocab_size, h, groups.attn_tp, None)
        self.logits_processor = LogitsProcessor(capture_hidden=True)
        self.own_embed = self.own_head = False  # set by load_weights

    def share_embed_and_head(self, target: nn.Module) -> None:
        """Take the target's embedding and LM head where the checkpoint had none."""
        embed, head = target.get_submodule("model.embed_tokens"), target.get_submodule("lm_head")
        assert isinstance(embed, VocabParallelEmbedding) and isinstance(head, ParallelLMHead)
        if not self.own_embed:
            self.embed_tokens = embed
        if not self.own_head:
            self.lm_head = head

    @torch.inference_mode()
    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, forward_batch: ForwardBatch
    ) -> LogitsProcessorOutput:
        features = forward_batch.spec_hidden
        if features is None:
            raise ValueError("an EAGLE head needs the target's hidden states (spec_hidden)")
        embeds = self.embed_tokens(input_ids)
        hidden = self.fc(torch.cat((embeds, features.to(embeds.dtype)), dim=-1))
        rope = self.rotary_emb.cos_sin(positions, hidden.dtype)
        layer: LlamaDecoderLayer = self.layers[0]  # type: ignore[assignment]
        residual = hidden  # EAGLE's first layer: no input norm
        attn = layer.self_attn(rope, hidden, forward_batch)
        normed, residual = layer.post_attention_layernorm(attn, residual)
        out: torch.Tensor = layer.mlp(normed) + residual  # and no final norm
        logits: LogitsProcessorOutput = self.logits_processor(out, self.lm_head, forward_batch)
        return logits

    def load_weights(self, weights: Iterable[tuple[str, Weight]]) -> None:
        """EAGLE's names; the layer's through LlamaForCausalLM's loader (fused q/k/v and
        gate/up, TP slices). Every tensor but the embedding and LM head must be present."""
        params = dict(self.named_parameters())
        loaded: set[str] = set()
        for name, tensor in weights:
            if name.startswith("model."):
                name = name.removeprefix("model.")
            if "rotary_emb.inv_freq" in name:
                continue
            if name in ("fc.weight", "fc.bias"):
                param = params[name]
                if param.shape != weight_shape(tensor):
                    raise ValueError(f"{name}: shape {weight_shape(tensor)} ≠ {tuple(param.shape)}")
                param.data.copy_(read_full(tensor))
                loaded.add(name)
                continue
            loaded.add(load_tensor(self, params, name, tensor))
        self.own_embed = "embed_tokens.weight" in loaded
        self.own_head = "lm_head.weight" in loaded
        optional = {"embed_tokens.weight", "lm_head.weight", "layers.0.input_layernorm.weight"}
        missing = set(params) - loaded - optional
        if missing:
            raise ValueError(f"EAGLE checkpoint is missing weights: {sorted(missing)[:5]} …")
