"""DeepSeek's multi-head latent attention (MLA), absorbed: every token caches one latent row
(the normalised kv_a of kv_lora_rank values, then the roped k_pe of qk_rope_head_dim), and
attention is MQA over those rows, one KV head for all query heads.

Projections (checkpoint names): q comes from `q_a_proj` → `q_a_layernorm` → `q_b_proj` when the
config has a q_lora_rank (V2, V3), else straight from `q_proj` (V2-Lite); `kv_a_proj_with_mqa`
gives the latent; `kv_b_proj` ([H·(nope + v), kv_lora_rank]) would expand it into per-head
k_nope and v. With a q_lora_rank, q_a_proj and kv_a_proj_with_mqa run as one fused projection
(`fused_qkv_a_proj_with_mqa`, SGLang's name). Absorption splits kv_b_proj per head into
w_kc [H, nope, kv_lora] and w_vc [H, v, kv_lora] once after loading:

- q_nope · k_nope = (q_nope · w_kc) · kv_a, so the query becomes [q_nope·w_kc ‖ q_pe] (576 wide
  at V3's shapes) and the key is the cached row itself;
- the attention output over the rows' first kv_lora_rank values is a latent [H, kv_lora]; · w_vcᵀ
  gives each head's v-weighted sum, then o_proj.

The softmax scale is 1/sqrt(qk_nope + qk_rope) (not of the latent width), times mscale² for a
YaRN context stretch with mscale_all_dim, as transformers and SGLang. The rotary is GPT-J style
(interleaved pairs) unless the config says otherwise.

Tensor parallelism splits the heads (q_b_proj / q_proj and kv_b_proj column-parallel, o_proj
row-parallel); the latent projections are replicated, so every attention-TP rank computes and
caches the same latent rows. Runs in the scheduler process inside the model's forward.
"""

from __future__ import annotations

import torch
from torch import nn

from radixserve.engine.configs.model_config import MLAConfig, ModelConfig
from radixserve.engine.distributed import GroupHandle
from radixserve.engine.forward_batch import ForwardBatch
from radixserve.engine.layers.layernorm import RMSNorm
from radixserve.engine.layers.parallel_linear import ColumnParallelLinear, RowParallelLinear
from radixserve.engine.layers.radix_attention import RadixAttention
from radixserve.engine.layers.rotary_embedding import (
    RotaryCosSin,
    apply_rotary,
    apply_rotary_interleaved,
    yarn_mscale,
)


def mla_softmax_scale(config: ModelConfig, mla: MLAConfig) -> float:
    scale = float(mla.qk_head_dim**-0.5)
    s = config.rope_scaling
    if s.rope_type != "default" and s.mscale_all_dim:
        m = yarn_mscale(s.factor, s.mscale_all_dim)
        scale *= m * m
    return scale


class MLAAttention(nn.Module):
    def __init__(self, config: ModelConfig, layer_id: int, tp: GroupHandle | None = None) -> None:
        super().__init__()
        tp = tp or GroupHandle.single()
        assert config.mla is not None, "MLAAttention needs the config's MLA fields"
        m = self.mla = config.mla
        heads, hidden, bias = config.num_attention_heads, config.hidden_size, config.attention_bias
        self.num_heads = heads // tp.size  # this rank's
        one = GroupHandle.single()  # the latent projections: whole on every rank
        self.fused_qkv_a_proj_with_mqa: ColumnParallelLinear | None = None
        self.q_proj: ColumnParallelLinear | None = None
        self.q_a_layernorm: RMSNorm | None = None
        self.q_b_proj: ColumnParallelLinear | None = None
        self.kv_a_proj_with_mqa: ColumnParallelLinear | None = None
        if m.q_lora_rank is not None:
            self.fused_qkv_a_proj_with_mqa = ColumnParallelLinear(
                hidden, [m.q_lora_rank, m.latent_dim], bias, one
            )
            self.q_a_layernorm = RMSNorm(m.q_lora_rank, config.rms_norm_eps)
            self.q_b_proj = ColumnParallelLinear(m.q_lora_rank, [heads * m.qk_head_dim], False, tp)
        else:
            self.q_proj = ColumnParallelLinear(hidden, [heads * m.qk_head_dim], False, tp)
            self.kv_a_proj_with_mqa = ColumnParallelLinear(hidden, [m.latent_dim], bias, one)
        self.kv_a_layernorm = RMSNorm(m.kv_lora_rank, config.rms_norm_eps)
        per_head = m.qk_nope_head_dim + m.v_head_dim
        self.kv_b_proj = ColumnParallelLinear(m.kv_lora_rank, [heads * per_head], False, tp)
        self.o_proj = RowParallelLinear(heads * m.v_head_dim, hidden, bias, tp)
        # absorbed kv_b_proj (`absorb`, after loading): [H_local, nope, kv_lora], [H_local, v, …]
        self.register_buffer("w_kc", torch.empty(0), persistent=False)
        self.register_buffer("w_vc", torch.empty(0), persistent=False)
        self.attn = RadixAttention(
            self.num_heads,
            m.latent_dim,
            mla_softmax_scale(config, m),
            1,
            layer_id,
            v_head_dim=m.kv_lora_rank,
        )

    def absorb(self) -> None:
        """Split this rank's kv_b_proj rows into w_kc / w_vc (call once the weights are in)."""
        weight = self.kv_b_proj.weight
        assert weight is not None, "absorb before the CPU prepack releases kv_b_proj's weight"
        m = self.mla
        per_head = weight.view(self.num_heads, m.qk_nope_head_dim + m.v_head_dim, -1)
        self.w_kc = per_head[:, : m.qk_nope_head_dim].contiguous()
        self.w_vc = per_head[:, m.qk_nope_head_dim :].contiguous()

    def _q_and_latent(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """[T, H_local, qk_head_dim] queries and [T, latent_dim] latent rows (before norm/rope)."""
        m = self.mla
        if self.fused_qkv_a_proj_with_mqa is not None:
            assert self.q_a_layernorm is not None and self.q_b_proj is not None
            q_lat, latent = self.fused_qkv_a_proj_with_mqa(hidden).split(
                [m.q_lora_rank or 0, m.latent_dim], dim=-1
            )
            q = self.q_b_proj(self.q_a_layernorm.forward_plain(q_lat))
        else:
            assert self.q_proj is not None and self.kv_a_proj_with_mqa is not None
            q, latent = self.q_proj(hidden), self.kv_a_proj_with_mqa(hidden)
        return q.view(-1, self.num_heads, m.qk_head_dim), latent

    def _rotate(
        self, q_pe: torch.Tensor, k_pe: torch.Tensor, rope: RotaryCosSin
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if self.mla.rope_interleave:
            return apply_rotary_interleaved(q_pe, k_pe, rope)
        return apply_rotary(q_pe.contiguous(), k_pe.contiguous(), rope)

    def forward(
        self, rope: RotaryCosSin, hidden: torch.Tensor, forward_batch: ForwardBatch
    ) -> torch.Tensor:
        m = self.mla
        q, latent = self._q_and_latent(hidden)
        q_nope, q_pe = q.split([m.qk_nope_head_dim, m.qk_rope_head_dim], dim=-1)
        kv_a, k_pe = latent.split([m.kv_lora_rank, m.qk_rope_head_dim], dim=-1)
        kv_a = self.kv_a_layernorm.forward_plain(kv_a.contiguous())
        q_pe, k_pe = self._rotate(q_pe, k_pe.unsqueeze(1), rope)
        # [H, T, nope] @ [H, nope, kv_lora] → the query in latent space, per head
        q_latent = torch.bmm(q_nope.transpose(0, 1), self.w_kc).transpose(0, 1)
        q_full = torch.cat([q_latent, q_pe.to(q_latent.dtype)], dim=-1)
        k_full = torch.cat([kv_a, k_pe.squeeze(1).to(kv_a.dtype)], dim=-1)
        out = self.attn(
            q_full.reshape(-1, self.num_heads * m.latent_dim),
            k_full,
            k_full[:, : m.kv_lora_rank],
            forward_batch,
        )
        # [H, T, kv_lora] @ [H, kv_lora, v] → each head's value-weighted sum
        out_latent = out.view(-1, self.num_heads, m.kv_lora_rank).transpose(0, 1)
        v = torch.bmm(out_latent, self.w_vc.transpose(1, 2)).transpose(0, 1)
        projected: torch.Tensor = self.o_proj(v.reshape(-1, self.num_heads * m.v_head_dim))
        return projected
