"""AttentionBackend: the contract between the attention layers and a kernel implementation.

Contract: `forward` first writes the new K/V at `forward_batch.out_cache_loc` into the KV
pool, then attends each request's queries over its whole history, read through
`forward_batch.kv_rows[i, :seq_lens[i]]`: the copy of `req_to_token[req_pool_indices[i]]` taken
when the batch was built (under overlap the live rows may already hold the next batch's).
`init_forward_metadata` runs once per forward (not per layer) and may precompute indices
shared by all layers. A backend sees its layer (`layers.radix_attention.RadixAttention`) only
through the `forward_batch.AttentionLayer` Protocol: heads, head size, scale and layer id.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch

from radixserve.engine.forward_batch import AttentionLayer, ForwardBatch


class AttentionBackend(ABC):
    def init_forward_metadata(self, forward_batch: ForwardBatch) -> None:  # noqa: B027
        """Per-forward precomputation; the default backend needs none."""

    def _write_kv(
        self, k: torch.Tensor, v: torch.Tensor, layer: AttentionLayer, fb: ForwardBatch
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Store this forward's new K/V in the pool at `out_cache_loc`; the layer's whole
        (K, V) buffers, each [pool slots, Hkv, D]."""
        k = k.view(-1, layer.num_kv_heads, layer.head_dim)
        v = v.view(-1, layer.num_kv_heads, layer.v_head_dim)
        fb.token_to_kv_pool.set_kv_buffer(layer.layer_id, fb.out_cache_loc, k, v)
        return fb.token_to_kv_pool.get_kv_buffer(layer.layer_id)

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        layer: AttentionLayer,
        forward_batch: ForwardBatch,
    ) -> torch.Tensor:
        """q: [T, Hq·D], k: [T, Hkv·D], v: [T, Hkv·Dv] → [T, Hq·Dv] (Dv = layer.v_head_dim,
        D unless values are narrower than keys, as in absorbed MLA)."""
        if forward_batch.forward_mode.is_decode():
            return self.forward_decode(q, k, v, layer, forward_batch)
        return self.forward_extend(q, k, v, layer, forward_batch)

    @abstractmethod
    def forward_extend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        layer: AttentionLayer,
        forward_batch: ForwardBatch,
    ) -> torch.Tensor:
        """EXTEND and MIXED batches: causal attention over cached prefix + new tokens."""

    @abstractmethod
    def forward_decode(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        layer: AttentionLayer,
        forward_batch: ForwardBatch,
    ) -> torch.Tensor:
        """DECODE batches: one query per request over its whole history."""
