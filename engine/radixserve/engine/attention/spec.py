"""AttentionSpec: what a backend may plan for before the first forward (model shape, limits).

The ModelRunner builds it once from the model config and its pool sizes and hands it to the
registry; backends that plan per batch (triton's CUDA-graph buffers, FlashInfer's wrappers)
size their buffers and plans from it. Plain data, no torch state.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True, slots=True)
class AttentionSpec:
    num_heads: int  # query heads on this rank
    num_kv_heads: int  # KV heads on this rank
    head_dim: int
    dtype: torch.dtype  # activations (q) and KV pool dtype
    device: torch.device
    max_batch_size: int  # rows of req_to_token: the most requests in one forward
    max_context_len: int  # the longest sequence a request may reach
    page_size: int = 1
    deterministic: bool = False  # --enable-deterministic-inference (grouped backend only)
    tiled_extend: bool = True  # not --disable-tiled-extend (grouped backend's C++ kernel)
    v_head_dim: int | None = None  # of values, where narrower than keys (MLA's latent rows)
