"""Triton kernels, each with a plain-PyTorch reference (imports nothing from the engine).

Re-exports the triton-free layouts only. The kernels live in one module per family
(`decode_attention`, `extend_attention`, `kv_store`, `norm`, `activation`, `rotary`, `moe`) and
are imported by that path, since they need triton, an optional (GPU) dependency; the
references are in `reference`. See docs/kernels.md.
"""

from __future__ import annotations

from radixserve.kernels.layout import (
    AlignedRouting,
    KvIndices,
    NormOutput,
    PagedKv,
    RaggedKv,
    RotaryOutput,
    TopKOutput,
    build_kv_indices,
    moe_align_block_size,
)

__all__ = [
    "AlignedRouting",
    "KvIndices",
    "NormOutput",
    "PagedKv",
    "RaggedKv",
    "RotaryOutput",
    "TopKOutput",
    "build_kv_indices",
    "moe_align_block_size",
]
