"""Llama decoder (SmolLM2, Llama 2/3). Qwen2 and Qwen3 reuse it: Qwen2 adds q/k/v biases and
Qwen3 adds per-head q/k RMSNorm, both switched by ModelConfig fields rather than copied code.

Parameter names follow HF checkpoints except the fused `qkv_proj` and `gate_up_proj`, which
`load_weights` fills shard by shard. Under tensor parallelism (`groups.tp`) q/k/v and gate/up
are column-parallel, o_proj and down_proj row-parallel, embedding and LM head vocab-parallel;
each layer copies only its rank's slice of a checkpoint tensor. Under DP attention
(`groups.dp_attention`) attention, embedding and LM head are split over the attention-TP group
(this DP rank's ranks) and the MLP over the whole TP group, between `dp_gather` /
`dp_scatter`. One RotaryEmbedding (cos/sin tables) serves all layers: `LlamaModel` gathers the
batch's rows once per forward and hands them to every layer.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
from torch import nn

from radixserve.engine.configs.model_config import ModelConfig
from radixserve.engine.distributed import GroupHandle, ParallelGroups
from radixserve.engine.forward_batch import ForwardBatch
from radixserve.engine.layers.activation import SiluAndMul
from radixserve.engine.layers.dp_attention import dp_gather, dp_scatter
from radixserve.engine.layers.layernorm import RMSNorm
from radixserve.engine.layers.logits_processor import LogitsProcessor, LogitsProcessorOutput
from radixserve.engine.layers.parallel_linear import (
    ColumnParallelLinear,
    QKVParallelLinear,
    RowParallelLinear,
    kv_head_layout,
)
from radixserve.engine.layers.radix_attention import RadixAttention
from radixserve.engine.layers.rotary_embedding import RotaryCosSin, RotaryEmbedding, apply_rotary
from radixserve.engine.layers.vocab_parallel import ParallelLMHead, VocabParallelEmbedding
from radixserve.engine.model_loader.weight import Weight, read_full, weight_shape
from radixserve.engine.models.base import CausalLM

# checkpoint projection name → (fused parameter, shard index)
_STACKED = {
    "q_proj": ("qkv_proj", 0),
    "k_proj": ("qkv_proj", 1),
    "v_proj": ("qkv_proj", 2),
    "gate_proj": ("gate_up_proj", 0),
    "up_proj": ("gate_up_proj", 1),
}


class LlamaAttention(nn.Module):
    def __init__(self, config: ModelConfig, layer_id: int, tp: GroupHandle | None = None) -> None:
        super().__init__()
        tp = tp or GroupHandle.single()
        c = config
        self.num_heads = c.num_attention_heads // tp.size  # this rank's heads
        self.num_kv_heads = kv_head_layout(c.num_key_value_heads, tp).num_local_heads
        self.head_dim = c.head_dim
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        self.qkv_proj = QKVParallelLinear(
            c.hidden_size,
            c.head_dim,
            c.num_attention_heads,
            c.num_key_value_heads,
            c.attention_bias,
            tp,
        )
        q_total = c.num_attention_heads * c.head_dim
        self.o_proj = RowParallelLinear(q_total, c.hidden_size, c.o_proj_bias, tp)
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
    def __init__(self, config: ModelConfig, tp: GroupHandle | None = None) -> None:
        super().__init__()
        tp = tp or GroupHandle.single()
        inter = config.intermediate_size
        self.gate_up_proj = ColumnParallelLinear(config.hidden_size, [inter, inter], False, tp)
        self.down_proj = RowParallelLinear(inter, config.hidden_size, False, tp)
        self.act_fn = SiluAndMul()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.down_proj(self.act_fn(self.gate_up_proj(x)))
        return out


# Builds decoder layer i's MLP: dense here; MoE models return their expert block on sparse layers.
MlpFactory = Callable[[ModelConfig, int, GroupHandle], nn.Module]
# Builds decoder layer i's attention over the attention-TP group: a module called as
# (rope, hidden, forward_batch) → hidden (LlamaAttention here; DeepSeek's MLA).
AttnFactory = Callable[[ModelConfig, int, GroupHandle], nn.Module]


def dense_mlp(config: ModelConfig, layer_id: int, tp: GroupHandle) -> nn.Module:
    return LlamaMLP(config, tp)


class LlamaDecoderLayer(nn.Module):
    def __init__(
        self,
        config: ModelConfig,
        layer_id: int,
        groups: ParallelGroups | None = None,
        make_mlp: MlpFactory = dense_mlp,
        make_attn: AttnFactory = LlamaAttention,
    ) -> None:
        super().__init__()
        self.groups = groups or ParallelGroups.single()
        self.self_attn = make_attn(config, layer_id, self.groups.attn_tp)
        self.mlp = make_mlp(config, layer_id, self.groups.tp)
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
        if not forward_batch.forward_mode.is_idle():  # an IDLE rank has no tokens to attend
            hidden = self.self_attn(rope, hidden, forward_batch)
        hidden, residual = self.post_attention_layernorm(hidden, residual)
        meta = forward_batch.dp_meta
        if meta is None:
            return self.mlp(hidden), residual
        # DP attention: the MLP runs over every DP rank's tokens at once (whole TP group)
        out = dp_scatter(self.mlp(dp_gather(hidden, meta, self.groups)), meta)
        return out, residual


class LlamaModel(nn.Module):
    def __init__(
        self,
        config: ModelConfig,
        groups: ParallelGroups | None = None,
        make_mlp: MlpFactory = dense_mlp,
        make_attn: AttnFactory = LlamaAttention,
    ) -> None:
        super().__init__()
        groups = groups or ParallelGroups.single()
        self.hidden_size = config.hidden_size
        self.embed_tokens = VocabParallelEmbedding(
            config.vocab_size, config.hidden_size, groups.attn_tp
        )
        self.layers = nn.ModuleList(
            LlamaDecoderLayer(config, i, groups, make_mlp, make_attn)
            for i in range(config.num_hidden_layers)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        c = config
        self.rotary_emb = RotaryEmbedding(
            c.head_dim, c.max_position_embeddings, c.rope_theta, c.rope_scaling
        )

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, forward_batch: ForwardBatch
    ) -> torch.Tensor:
        if forward_batch.forward_mode.is_idle():
            weight = self.norm.weight
            hidden = weight.new_empty((0, self.hidden_size))
        else:
            hidden = self.embed_tokens(input_ids)
        rope = self.rotary_emb.cos_sin(positions, hidden.dtype)
        residual: torch.Tensor | None = None
        for layer in self.layers:
            hidden, residual = layer(rope, hidden, residual, forward_batch)
        normed: torch.Tensor = self.norm(hidden, residual)[0]
        return normed


class LlamaForCausalLM(CausalLM):
    def __init__(self, config: ModelConfig, groups: ParallelGroups | None = None) -> None:
        super().__init__()
        self.config = config
        groups = groups or ParallelGroups.single()
        self.model = LlamaModel(config, groups, self.mlp_factory(groups), self.attn_factory())
        tie = self.model.embed_tokens if config.tie_word_embeddings else None
        # Under DP attention each DP rank samples its own requests: the LM head is split over
        # its attention-TP group, as the embedding (without DP attention that is the TP group).
        self.lm_head = ParallelLMHead(config.vocab_size, config.hidden_size, groups.attn_tp, tie)
        self.logits_processor = LogitsProcessor()

    def attn_factory(self) -> AttnFactory:
        """What builds each decoder layer's attention (DeepSeek: MLA)."""
        return LlamaAttention

    def mlp_factory(self, groups: ParallelGroups) -> MlpFactory:
        """What builds each decoder layer's MLP (MoE architectures add their EP layout)."""
        return self.make_mlp

    @staticmethod
    def make_mlp(config: ModelConfig, layer_id: int, tp: GroupHandle) -> nn.Module:
        """Decoder layer `layer_id`'s MLP (the MoE architectures override this)."""
        return dense_mlp(config, layer_id, tp)

    @torch.inference_mode()
    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, forward_batch: ForwardBatch
    ) -> LogitsProcessorOutput:
        hidden = self.model(input_ids, positions, forward_batch)
        if forward_batch.forward_mode.is_idle():
            return LogitsProcessorOutput(hidden.new_empty((0, self.config.vocab_size)).float())
        out: LogitsProcessorOutput = self.logits_processor(hidden, self.lm_head, forward_batch)
        return out

    def load_weights(self, weights: Iterable[tuple[str, Weight]]) -> None:
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

    def _load_one(self, params: dict[str, nn.Parameter], name: str, w: Weight) -> str:
        return load_tensor(self, params, name, w)


def load_tensor(model: nn.Module, params: dict[str, nn.Parameter], name: str, w: Weight) -> str:
    """Copy checkpoint tensor `name` into `model` (a Llama-layout module: fused q/k/v and
    gate/up filled shard by shard, TP-sharded modules their slice); the parameter it filled."""
    parts = name.split(".")
    is_bias = name.endswith(".bias")
    for proj, (fused, shard) in _STACKED.items():
        if proj in parts:
            target = name.replace(proj, fused)
            module = model.get_submodule(target.rsplit(".", 1)[0])
            assert isinstance(module, ColumnParallelLinear)
            module.load_shard(shard, w, is_bias)
            return target
    if name not in params:
        raise ValueError(f"checkpoint tensor {name!r} has no place in {type(model).__name__}")
    owner = model.get_submodule(name.rsplit(".", 1)[0])
    if isinstance(owner, _SHARDED):
        owner.load_full(w, is_bias)  # copies this rank's slice only
        return name
    param = params[name]
    if param.shape != weight_shape(w):
        raise ValueError(f"{name}: shape {weight_shape(w)} ≠ model {tuple(param.shape)}")
    param.data.copy_(read_full(w))
    return name


_SHARDED = (RowParallelLinear, VocabParallelEmbedding, ParallelLMHead, ColumnParallelLinear)
