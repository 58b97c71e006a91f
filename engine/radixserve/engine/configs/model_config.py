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


@dataclass(frozen=True, slots=True)
class MoEConfig:
    """Sparse MLP facts (Qwen3-MoE, Qwen2-MoE, Mixtral); absent on dense models."""

    num_experts: int
    top_k: int  # experts per token (`num_experts_per_tok`)
    moe_intermediate_size: int  # per routed expert
    norm_topk_prob: bool  # renormalise the top-k softmax weights to sum 1 (Mixtral: always)
    shared_expert_intermediate_size: int = 0  # Qwen2-MoE's sigmoid-gated shared expert; 0: none
    decoder_sparse_step: int = 1  # layer i is sparse when (i + 1) % step == 0 ...
    mlp_only_layers: tuple[int, ...] = ()  # ... and i is not listed here

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
        `rope_parameters`; `head_dim` defaults to hidden / heads."""
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
            head_dim=int(cfg.get("head_dim") or cfg["hidden_size"] // heads),
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


def _parse_moe(cfg: dict[str, Any], arch: str) -> MoEConfig | None:
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
    )
