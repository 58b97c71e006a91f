"""ModelConfig: the architecture facts the engine needs, parsed from a HuggingFace config dict.

Owns the translation from `config.json` (or GGUF metadata turned into the same dict) into one
frozen object. It does not load weights or tokenizers. Runs in every scheduler process.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import torch

_DTYPES = MappingProxyType(
    {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
)


@dataclass(frozen=True, slots=True)
class RopeScaling:
    """Rotary scaling as the HF config describes it (`rope_scaling` / `rope_parameters`)."""

    rope_type: str = "default"  # default | linear | llama3 | yarn | dynamic
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int | None = None
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    attention_factor: float | None = None
    mscale: float | None = None  # YaRN's cos/sin multiplier is mscale(f, mscale) / mscale(f,
    mscale_all_dim: float | None = None  # mscale_all_dim) (DeepSeek); MLA's softmax scale too


@dataclass(frozen=True, slots=True)
class MLAConfig:
    """DeepSeek multi-head latent attention (absent elsewhere). Each token caches one latent row
    of kv_lora_rank + qk_rope_head_dim values per layer, shared by every query head."""

    q_lora_rank: int | None  # None (V2-Lite): q_proj straight from the hidden state
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    rope_interleave: bool = True  # rotary on (x0, x1), (x2, x3)… pairs (GPT-J), not halves

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def latent_dim(self) -> int:
        """Values cached per token per layer: the normalised kv_a, then the roped k_pe."""
        return self.kv_lora_rank + self.qk_rope_head_dim


@dataclass(frozen=True, slots=True)
class MoEConfig:
    """Sparse MLP facts (Qwen3-MoE, Qwen2-MoE, Mixtral, DeepSeek-V2/V3); absent on dense models.

    Routing (layers/moe_router.py): `scoring_func` softmax or sigmoid over the router logits;
    with n_group > 1 only the experts of the best `topk_group` groups are candidates (group
    score: the max for softmax, V2; the sum of the top two biased scores for sigmoid, V3); a
    `correction_bias` (V3's e_score_correction_bias) shifts the scores used to choose but not
    the weights; the chosen weights are renormalised when norm_topk_prob, then multiplied by
    routed_scaling_factor."""

    num_experts: int
    top_k: int  # experts per token (`num_experts_per_tok`)
    moe_intermediate_size: int  # per routed expert
    norm_topk_prob: bool  # renormalise the top-k softmax weights to sum 1 (Mixtral: always)
    shared_expert_intermediate_size: int = 0  # shared expert(s), all tokens; 0: none
    shared_expert_gated: bool = True  # Qwen2-MoE scales it by sigmoid(gate · x); DeepSeek: not
    decoder_sparse_step: int = 1  # layer i is sparse when (i + 1) % step == 0 ...
    mlp_only_layers: tuple[int, ...] = ()  # ... and i is not listed here
    scoring_func: str = "softmax"  # softmax | sigmoid
    n_group: int = 1
    topk_group: int = 1
    correction_bias: bool = False  # the router has e_score_correction_bias (noaux_tc)
    routed_scaling_factor: float = 1.0

    @property
    def plain_routing(self) -> bool:
        """Softmax → top-k (→ renormalise): the routing the fused Triton top-k implements."""
        return (
            self.scoring_func == "softmax"
            and self.n_group <= 1
            and not self.correction_bias
            and self.routed_scaling_factor == 1.0
        )

    def is_sparse_layer(self, layer_id: int) -> bool:
        """Whether decoder layer `layer_id` has the MoE MLP (else the dense one), as HF decides."""
        step = self.decoder_sparse_step
        return layer_id not in self.mlp_only_layers and step > 0 and (layer_id + 1) % step == 0


@dataclass(frozen=True, slots=True)
class ModelConfig:
    architecture: str
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool = False  # q/k/v biases
    o_proj_bias: bool = False
    qk_norm: bool = False
    rope_scaling: RopeScaling = field(default_factory=RopeScaling)
    eos_token_ids: tuple[int, ...] = ()
    dtype: torch.dtype = torch.float32
    moe: MoEConfig | None = None
    mla: MLAConfig | None = None
    num_nextn_predict_layers: int = 0  # DeepSeek-V3's MTP layers, stored after the decoder's

    @property
    def context_len(self) -> int:
        return self.max_position_embeddings

    @classmethod
    def from_hf_dict(
        cls,
        cfg: dict[str, Any],
        dtype: str | torch.dtype = "float32",
        eos_token_ids: tuple[int, ...] = (),
    ) -> ModelConfig:
        """Build from a parsed `config.json`. Accepts both `rope_theta` and transformers 5's
        `rope_parameters`; `head_dim` defaults to hidden / heads (with MLA it is the rotary
        part, qk_rope_head_dim, as transformers sets it)."""
        archs = cfg.get("architectures") or []
        if not archs:
            raise ValueError("config.json has no 'architectures' entry")
        heads = int(cfg["num_attention_heads"])
        rope_params = cfg.get("rope_parameters") or {}
        rope_theta = cfg.get("rope_theta", rope_params.get("rope_theta", 10000.0))
        scaling_dict = cfg.get("rope_scaling") or rope_params
        return cls(
            architecture=archs[0],
            hidden_size=int(cfg["hidden_size"]),
            intermediate_size=int(cfg["intermediate_size"]),
            num_hidden_layers=int(cfg["num_hidden_layers"]),
            num_attention_heads=heads,
            num_key_value_heads=int(cfg.get("num_key_value_heads") or heads),
            head_dim=_head_dim(cfg, heads),
            vocab_size=int(cfg["vocab_size"]),
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            rope_theta=float(rope_theta),
            max_position_embeddings=int(cfg.get("max_position_embeddings", 4096)),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            attention_bias=_attention_bias(cfg, archs[0]),
            o_proj_bias=_o_proj_bias(cfg, archs[0]),
            qk_norm=archs[0].startswith("Qwen3"),
            rope_scaling=_parse_rope_scaling(scaling_dict),
            eos_token_ids=eos_token_ids or _eos_ids(cfg.get("eos_token_id")),
            dtype=parse_dtype(dtype),
            moe=_parse_moe(cfg, archs[0]),
            mla=_parse_mla(cfg),
            num_nextn_predict_layers=int(cfg.get("num_nextn_predict_layers") or 0),
        )


def parse_dtype(dtype: str | torch.dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in _DTYPES:
        raise ValueError(f"dtype: expected one of {sorted(_DTYPES)}, got {dtype!r}")
    return _DTYPES[dtype]


def _attention_bias(cfg: dict[str, Any], arch: str) -> bool:
    # Qwen2 always has q/k/v biases and its config does not say so.
    if arch.startswith("Qwen2"):
        return True
    return bool(cfg.get("attention_bias", False))


def _o_proj_bias(cfg: dict[str, Any], arch: str) -> bool:
    # HF's `attention_bias` (Llama, Qwen3) biases o_proj too; Qwen2's o_proj never has one.
    return not arch.startswith("Qwen2") and bool(cfg.get("attention_bias", False))


def _head_dim(cfg: dict[str, Any], heads: int) -> int:
    if "kv_lora_rank" in cfg:  # MLA: the rotary table's width
        return int(cfg["qk_rope_head_dim"])
    return int(cfg.get("head_dim") or cfg["hidden_size"] // heads)


def _parse_mla(cfg: dict[str, Any]) -> MLAConfig | None:
    if "kv_lora_rank" not in cfg:
        return None
    q_lora = cfg.get("q_lora_rank")
    return MLAConfig(
        q_lora_rank=int(q_lora) if q_lora else None,
        kv_lora_rank=int(cfg["kv_lora_rank"]),
        qk_nope_head_dim=int(cfg["qk_nope_head_dim"]),
        qk_rope_head_dim=int(cfg["qk_rope_head_dim"]),
        v_head_dim=int(cfg["v_head_dim"]),
        # DeepSeek's rotary is GPT-J style (SGLang: is_neox_style=False); V3 configs may say so
        rope_interleave=bool(cfg.get("rope_interleave", True)),
    )


def _deepseek_moe(cfg: dict[str, Any], arch: str) -> MoEConfig:
    """DeepSeek-V2/V3: layer i is sparse iff i ≥ first_k_dense_replace and i % moe_layer_freq
    is 0 (SGLang's rule), expressed as mlp_only_layers; shared experts ungated."""
    layers, first = int(cfg["num_hidden_layers"]), int(cfg.get("first_k_dense_replace") or 0)
    freq = int(cfg.get("moe_layer_freq") or 1)
    is_v3 = arch.startswith("DeepseekV3")
    method = cfg.get("topk_method") or ("noaux_tc" if is_v3 else "greedy")
    grouped = method in ("group_limited_greedy", "noaux_tc")
    inter = int(cfg["moe_intermediate_size"])
    return MoEConfig(
        num_experts=int(cfg["n_routed_experts"]),
        top_k=int(cfg["num_experts_per_tok"]),
        moe_intermediate_size=inter,
        norm_topk_prob=bool(cfg.get("norm_topk_prob", False)),
        shared_expert_intermediate_size=inter * int(cfg.get("n_shared_experts") or 0),
        shared_expert_gated=False,
        mlp_only_layers=tuple(i for i in range(layers) if i < first or i % freq),
        scoring_func=str(cfg.get("scoring_func") or ("sigmoid" if is_v3 else "softmax")),
        n_group=int(cfg.get("n_group") or 1) if grouped else 1,
        topk_group=int(cfg.get("topk_group") or 1) if grouped else 1,
        correction_bias=method == "noaux_tc",
        routed_scaling_factor=float(cfg.get("routed_scaling_factor") or 1.0),
    )


def _parse_moe(cfg: dict[str, Any], arch: str) -> MoEConfig | None:
    if arch.startswith("Deepseek"):
        return _deepseek_moe(cfg, arch)
    # Qwen names the expert count `num_experts`, Mixtral `num_local_experts`; 0 means dense.
    num_experts = int(cfg.get("num_experts") or cfg.get("num_local_experts") or 0)
    if num_experts <= 0:
        return None
    is_mixtral = arch.startswith("Mixtral")  # Mixtral always renormalises; its config is silent
    return MoEConfig(
        num_experts=num_experts,
        top_k=int(cfg["num_experts_per_tok"]),
        # Mixtral's experts are `intermediate_size` wide; Qwen's have their own size.
        moe_intermediate_size=int(cfg.get("moe_intermediate_size") or cfg["intermediate_size"]),
        norm_topk_prob=is_mixtral or bool(cfg.get("norm_topk_prob", False)),
        shared_expert_intermediate_size=int(cfg.get("shared_expert_intermediate_size") or 0),
        decoder_sparse_step=int(cfg.get("decoder_sparse_step") or 1),
        mlp_only_layers=tuple(int(i) for i in cfg.get("mlp_only_layers") or ()),
    )


def _eos_ids(value: int | list[int] | None) -> tuple[int, ...]:
    if value is None:
        return ()
    return tuple(value) if isinstance(value, list) else (int(value),)


def _parse_rope_scaling(d: dict[str, Any] | None) -> RopeScaling:
    if not d:
        return RopeScaling()
    rope_type = d.get("rope_type") or d.get("type") or "default"
    orig = d.get("original_max_position_embeddings")
    return RopeScaling(
        rope_type=str(rope_type),
        factor=float(d.get("factor", 1.0)),
        low_freq_factor=float(d.get("low_freq_factor", 1.0)),
        high_freq_factor=float(d.get("high_freq_factor", 4.0)),
        original_max_position_embeddings=int(orig) if orig is not None else None,
        beta_fast=float(d.get("beta_fast", 32.0)),
        beta_slow=float(d.get("beta_slow", 1.0)),
        attention_factor=d.get("attention_factor"),
        mscale=_optional_float(d.get("mscale")),
        mscale_all_dim=_optional_float(d.get("mscale_all_dim")),
    )


def _optional_float(value: Any) -> float | None:
    return None if value is None else float(value)
