"""The PyTorch reference backend: scaled-dot-product attention over gathered K/V, with GQA.

Extend: one SDPA call per request with an explicit causal mask offset by the cached prefix.
Decode: one padded SDPA call for the whole batch (keys beyond each seq_len masked out).
Simple and exact: the oracle that any faster backend added to the registry is tested against.
Values may be narrower than keys (absorbed MLA: one 576-wide latent KV head, 512-wide values).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from radixserve.engine.attention.base import AttentionBackend
from radixserve.engine.forward_batch import AttentionLayer, ForwardBatch


def _sdpa(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float
) -> torch.Tensor:
    """q: [B, Hq, Lq, D], k/v: [B, Hkv, Lk, D], mask: bool [B, 1, Lq, Lk] (True = attend)."""
    groups = q.shape[1] // k.shape[1]
    if groups > 1:
        k = k.repeat_interleave(groups, dim=1)
        v = v.repeat_interleave(groups, dim=1)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)


class TorchNativeAttnBackend(AttentionBackend):
    def forward_extend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        layer: AttentionLayer,
        forward_batch: ForwardBatch,
    ) -> torch.Tensor:
        fb = forward_batch
        k_cache, v_cache = self._write_kv(k, v, layer, fb)
        q = q.view(-1, layer.num_heads, layer.head_dim)
        out = q.new_empty((q.shape[0], layer.num_heads, layer.v_head_dim))
        rows = fb.req_kv_rows(max(fb.seq_lens_cpu))
        start = 0
        for i, (prefix, ext) in enumerate(
            zip(fb.extend_prefix_lens_cpu, fb.extend_seq_lens_cpu, strict=True)
        ):
            total = prefix + ext
            slots = rows[i, :total].long()
            qi = q[start : start + ext].transpose(0, 1).unsqueeze(0)
            ki = k_cache[slots].transpose(0, 1).unsqueeze(0).to(q.dtype)
            vi = v_cache[slots].transpose(0, 1).unsqueeze(0).to(q.dtype)
            # Query j sits at absolute position prefix + j and sees keys 0..prefix + j.
            mask = torch.ones(ext, total, dtype=torch.bool, device=q.device).tril(prefix)
            oi = _sdpa(qi, ki, vi, mask[None, None], layer.scaling)
            out[start : start + ext] = oi[0].transpose(0, 1)
            start += ext
        return out.view(-1, layer.num_heads * layer.v_head_dim)

    def forward_decode(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        layer: AttentionLayer,
        forward_batch: ForwardBatch,
    ) -> torch.Tensor:
        fb = forward_batch
        k_cache, v_cache = self._write_kv(k, v, layer, fb)
        bs, max_len = fb.batch_size, max(fb.seq_lens_cpu)
        slots = fb.req_kv_rows(max_len)
        ar = torch.arange(max_len, device=q.device)
        valid = ar[None, :] < fb.seq_lens[:, None]  # [B, L]
        slots = torch.where(valid, slots, torch.zeros_like(slots))
        ki = k_cache[slots].permute(0, 2, 1, 3).to(q.dtype)  # [B, Hkv, L, D]
        vi = v_cache[slots].permute(0, 2, 1, 3).to(q.dtype)
        qi = q.view(bs, layer.num_heads, 1, layer.head_dim)
        o = _sdpa(qi, ki, vi, valid[:, None, None, :], layer.scaling)
        return o.reshape(bs, layer.num_heads * layer.v_head_dim)
