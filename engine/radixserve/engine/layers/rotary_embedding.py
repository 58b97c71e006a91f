"""Rotary position embedding (NeoX / HF "rotate_half" layout, and the interleaved GPT-J layout
DeepSeek's MLA uses) with the rope-scaling variants the supported configs use: default,
linear, llama3 and yarn (with DeepSeek's mscale / mscale_all_dim).

The cos/sin table is computed once for all positions up to max_position in float32, and one
table serves every layer of a model: the model gathers the batch's rows once per forward
(`cos_sin`) and each attention layer applies them (`apply_rotary`), so any mix of requests
and offsets works. The model runner hands the module a fused op (`fused`: C++ on the CPU,
Triton on CUDA with the triton/flashinfer backends), which rotates q and k in place in one
pass with the PyTorch path's roundings.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import nn

from radixserve.engine.configs.model_config import RopeScaling
from radixserve.kernels.fused_ops_protocol import FusedOps


def _base_inv_freq(head_dim: int, base: float) -> torch.Tensor:
    return 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))


def _llama3_inv_freq(inv_freq: torch.Tensor, s: RopeScaling, max_pos: int) -> torch.Tensor:
    old_ctx = s.original_max_position_embeddings or max_pos
    low_wavelen = old_ctx / s.low_freq_factor
    high_wavelen = old_ctx / s.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / s.factor, inv_freq)
    smooth = (old_ctx / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor)
    smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled
    is_medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(is_medium, smoothed, scaled)


def _yarn_inv_freq(
    head_dim: int, base: float, s: RopeScaling, max_pos: int
) -> tuple[torch.Tensor, float]:
    orig = s.original_max_position_embeddings or max_pos

    def correction_dim(num_rotations: float) -> float:
        return (head_dim * math.log(orig / (num_rotations * 2 * math.pi))) / (2 * math.log(base))

    low = max(math.floor(correction_dim(s.beta_fast)), 0)
    high: float = min(math.ceil(correction_dim(s.beta_slow)), head_dim - 1)
    if low == high:
        high += 0.001  # avoid a zero-width ramp
    ramp = ((torch.arange(head_dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    extrapolation = 1 - ramp
    pos_freqs = base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    inv_freq = (1 / (s.factor * pos_freqs)) * (1 - extrapolation) + (1 / pos_freqs) * extrapolation
    attn_factor = s.attention_factor
    if attn_factor is None and s.mscale and s.mscale_all_dim:  # DeepSeek's pair (often 1)
        attn_factor = yarn_mscale(s.factor, s.mscale) / yarn_mscale(s.factor, s.mscale_all_dim)
    if attn_factor is None:
        attn_factor = yarn_mscale(s.factor)
    return inv_freq, float(attn_factor)


def yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    """YaRN's magnitude correction for a context stretched `factor` times."""
    return 0.1 * mscale * math.log(factor) + 1.0 if factor > 1 else 1.0


def compute_inv_freq(
    head_dim: int, base: float, scaling: RopeScaling, max_pos: int
) -> tuple[torch.Tensor, float]:
    """Inverse frequencies [head_dim // 2] and the cos/sin multiplier for a scaling type."""
    kind = scaling.rope_type
    if kind == "default":
        return _base_inv_freq(head_dim, base), 1.0
    if kind == "linear":
        return _base_inv_freq(head_dim, base) / scaling.factor, 1.0
    if kind == "llama3":
        return _llama3_inv_freq(_base_inv_freq(head_dim, base), scaling, max_pos), 1.0
    if kind in ("yarn", "deepseek_yarn"):  # SGLang's name for DeepSeek's yarn
        return _yarn_inv_freq(head_dim, base, scaling, max_pos)
    raise ValueError(
        f"rope_scaling.rope_type {kind!r} is not supported (default, linear, llama3, yarn)"
    )


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class RotaryCosSin(NamedTuple):
    """The table rows of one batch's positions, shared by all layers of one forward."""

    cos: torch.Tensor  # [T, 1, D], the model dtype, on the model's device
    sin: torch.Tensor  # [T, 1, D]
    fused: FusedOps | None = None  # the fused op, where the model runner set one


def apply_rotary(
    q: torch.Tensor, k: torch.Tensor, rope: RotaryCosSin
) -> tuple[torch.Tensor, torch.Tensor]:
    """q: [T, Hq, D]; k: [T, Hkv, D]. Returns rotated (q, k): with the fused op, q and k
    themselves, rotated in place (they are views of the fresh qkv projection)."""
    cos, sin, fused = rope
    if fused is not None and fused.rotary_(q, k, cos, sin):
        return q, k
    return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin


def apply_rotary_interleaved(
    q: torch.Tensor, k: torch.Tensor, rope: RotaryCosSin
) -> tuple[torch.Tensor, torch.Tensor]:
    """GPT-J style (DeepSeek's MLA): the pairs (x0, x1), (x2, x3)… each rotate by one
    frequency, and stay interleaved in the output. The tables hold each frequency twice
    (NeoX layout), so their first half is one angle per pair. q: [T, Hq, D], k: [T, Hk, D]."""
    half = rope.cos.shape[-1] // 2
    cos, sin = rope.cos[..., :half], rope.sin[..., :half]

    def rotate(x: torch.Tensor) -> torch.Tensor:
        even, odd = x[..., 0::2], x[..., 1::2]
        return torch.stack((even * cos - odd * sin, odd * cos + even * sin), dim=-1).flatten(-2)

    return rotate(q), rotate(k)


class RotaryEmbedding(nn.Module):
    """Owns one model's cos/sin tables ([max_position, D] float32 buffers)."""

    cos_cached: torch.Tensor
    sin_cached: torch.Tensor

    def __init__(self, head_dim: int, max_position: int, base: float, scaling: RopeScaling) -> None:
        super().__init__()
        self.fused: FusedOps | None = None  # set by the model runner (CPU / CUDA ops)
        inv_freq, mscale = compute_inv_freq(head_dim, base, scaling, max_position)
        t = torch.arange(max_position, dtype=torch.float32)
        freqs = torch.outer(t, inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        # Buffers, not parameters: they follow .to(device) but are never loaded from weights.
        self.register_buffer("cos_cached", emb.cos() * mscale, persistent=False)
        self.register_buffer("sin_cached", emb.sin() * mscale, persistent=False)

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype) -> RotaryCosSin:
        """positions: [T] int64 → the rows of both tables, cast to `dtype`."""
        cos = self.cos_cached[positions].unsqueeze(1).to(dtype)
        sin = self.sin_cached[positions].unsqueeze(1).to(dtype)
        return RotaryCosSin(cos, sin, self.fused)
