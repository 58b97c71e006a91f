"""Llama decoder (SmolLM2, Llama 2/3). Qwen2 and Qwen3 reuse it: Qwen2 adds q/k/v biases and
Qwen3 adds per-head q/k RMSNorm, both switched by ModelConfig fields rather than copied code.

Parameter names follow HF checkpoints except the fused `qkv_proj` and `gate_up_proj`, which
`load_weights` fills shard by shard. One RotaryEmbedding (cos/sin tables) serves all layers:
`LlamaModel` gathers the batch's rows once per forward and hands them to every layer.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import torch
from torch import nn

from radixserve.engine.configs.model_config import ModelConfig
from radixserve.engine.layers.activation import SiluAndMul
from radixserve.engine.layers.layernorm import RMSNorm
from radixserve.engine.layers.linear import Linear, MergedLinear
from radixserve.engine.layers.logits_processor import LogitsProcessor, LogitsProcessorOutput
from radixserve.engine.layers.radix_attention import RadixAttention
from radixserve.engine.layers.rotary_embedding import RotaryCosSin, RotaryEmbedding, apply_rotary
from radixserve.engine.layers.vocab_embedding import LMHead, VocabEmbedding
from radixserve.engine.models.base import CausalLM

if TYPE_CHECKING:  # annotations only: model_executor sits above models in the layers
    from radixserve.engine.model_executor.forward_batch import ForwardBatch

# checkpoint projection name → (fused parameter, shard index)
_STACKED = {
    "q_proj": ("qkv_proj", 0),
    "k_proj": ("qkv_proj", 1),
    "v_proj": ("qkv_proj", 2),
    "gate_proj": ("gate_up_proj", 0),
    "up_proj": ("gate_up_proj", 1),
}


class LlamaAttention(nn.Module):
    def __init__(self, config: ModelConfig, layer_id: int) -> None:
        super().__init__()
        c = config
        self.num_heads, self.num_kv_heads, self.head_dim = (
            c.num_attention_heads,
            c.num_key_value_heads,
            c.head_dim,
        )
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        self.qkv_proj = MergedLinear(
            c.hidden_size, [self.q_size, self.kv_size, self.kv_size], bias=c.attention_bias
        )
        self.o_proj = Linear(self.q_size, c.hidden_size, bias=c.o_proj_bias)
        self.q_norm = RMSNorm(self.head_dim, c.rms_norm_eps) if c.qk_norm else None
        self.k_norm = RMSNorm(self.head_dim, c.rms_norm_eps) if c.qk_norm else None
        self.attn = RadixAttention(
            self.num_heads, self.head_dim, self.head_dim**-0.5, self.num_kv_heads, layer_id
        )

    def forward(
        self, rope: RotaryCosSin, hidden: torch.Tensor, forward_batch: ForwardBatch
    ) -> torch.Tensor:
        qkv = self.qkv_proj(hidden)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.reshape(-1, self.num_heads, self.head_dim)
        k = k.reshape(-1, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm.forward_plain(q), self.k_norm.forward_plain(k)
        q, k = apply_rotary(q, k, rope)
        out = self.attn(q.reshape(-1, self.q_size), k.reshape(-1, self.kv_size), v, forward_batch)
        projected: torch.Tensor = self.o_proj(out)
        return projected


class LlamaMLP(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        inter = config.intermediate_size
        self.gate_up_proj = MergedLinear(config.hidden_size, [inter, inter], bias=False)
        self.down_proj = Linear(inter, config.hidden_size, bias=False)
        self.act_fn = SiluAndMul()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.down_proj(self.act_fn(self.gate_up_proj(x)))
        return out


class LlamaDecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer_id: int) -> None:
        super().__init__()
        self.self_attn = LlamaAttention(config, layer_id)
        self.mlp = LlamaMLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(
        self,
        rope: RotaryCosSin,
        hidden: torch.Tensor,
        residual: torch.Tensor | None,
        forward_batch: ForwardBatch,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        hidden, residual = self.input_layernorm(hidden, residual)
        hidden = self.self_attn(rope, hidden, forward_batch)
        hidden, residual = self.post_attention_layernorm(hidden, residual)
        return self.mlp(hidden), residual


class LlamaModel(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = VocabEmbedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(
            LlamaDecoderLayer(config, i) for i in range(config.num_hidden_layers)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        c = config
        self.rotary_emb = RotaryEmbedding(
            c.head_dim, c.max_position_embeddings, c.rope_theta, c.rope_scaling
        )

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, forward_batch: ForwardBatch
    ) -> torch.Tensor:
        hidden = self.embed_tokens(input_ids)
        rope = self.rotary_emb.cos_sin(positions, hidden.dtype)
        residual: torch.Tensor | None = None
        for layer in self.layers:
            hidden, residual = layer(rope, hidden, residual, forward_batch)
        normed: torch.Tensor = self.norm(hidden, residual)[0]
        return normed


class LlamaForCausalLM(CausalLM):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.model = LlamaModel(config)
        tie = self.model.embed_tokens if config.tie_word_embeddings else None
        self.lm_head = LMHead(config.vocab_size, config.hidden_size, tie)
        self.logits_processor = LogitsProcessor()

    @torch.inference_mode()
    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, forward_batch: ForwardBatch
    ) -> LogitsProcessorOutput:
        hidden = self.model(input_ids, positions, forward_batch)
        out: LogitsProcessorOutput = self.logits_processor(hidden, self.lm_head, forward_batch)
        return out

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy checkpoint tensors in (cast to the parameter dtype); fail on any left unset."""
        params = dict(self.named_parameters())
        loaded: set[str] = set()
        for name, tensor in weights:
            if "rotary_emb.inv_freq" in name:
                continue
            if name == "lm_head.weight" and self.config.tie_word_embeddings:
                continue
            loaded.add(self._load_one(params, name, tensor))
        missing = set(params) - loaded
        if self.config.tie_word_embeddings:
            missing.discard("lm_head.weight")
        if missing:
            raise ValueError(f"checkpoint is missing weights: {sorted(missing)[:5]} …")

    def _load_one(self, params: dict[str, nn.Parameter], name: str, tensor: torch.Tensor) -> str:
        parts = name.split(".")
        for proj, (fused, shard) in _STACKED.items():
            if proj in parts:
                target = name.replace(proj, fused)
                module = self.get_submodule(target.rsplit(".", 1)[0])
                assert isinstance(module, MergedLinear)
                module.load_shard(shard, tensor, is_bias=name.endswith(".bias"))
                return target
        if name not in params:
            raise ValueError(f"checkpoint tensor {name!r} has no place in {type(self).__name__}")
        param = params[name]
        if param.shape != tensor.shape:
            raise ValueError(f"{name}: shape {tuple(tensor.shape)} ≠ model {tuple(param.shape)}")
        param.data.copy_(tensor)
        return name
