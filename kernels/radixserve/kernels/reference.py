"""Plain-PyTorch references for every Triton kernel of this package, with the same signatures.

Owns the oracles the kernels are tested against: slow, loop-per-request or loop-per-expert,
fp32 math, no triton import. Runs wherever the tests run (CPU or GPU); never used for serving.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from radixserve.kernels.layout import (
    AlignedRouting,
    NormOutput,
    PagedKv,
    RaggedKv,
    RotaryOutput,
    TopKOutput,
)


@dataclass(frozen=True, slots=True)
class _Scores:
    """How scores are formed: scale, optional soft-cap, optional [M, N] visibility mask."""

    sm_scale: float
    logit_cap: float
    mask: torch.Tensor | None = None


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, params: _Scores) -> torch.Tensor:
    """q [M, Hq, D], k [N, Hkv, D], v [N, Hkv, Dv] -> [M, Hq, Dv] fp32; mask [M, N] bool or None."""
    group = q.shape[1] // k.shape[1]
    kf = k.float().repeat_interleave(group, dim=1)
    vf = v.float().repeat_interleave(group, dim=1)
    scores = torch.einsum("mhd,nhd->hmn", q.float(), kf) * params.sm_scale
    if params.logit_cap > 0:
        scores = params.logit_cap * torch.tanh(scores / params.logit_cap)
    if params.mask is not None:
        scores = scores.masked_fill(~params.mask[None], float("-inf"))
    return torch.einsum("hmn,nhd->mhd", torch.softmax(scores, dim=-1), vf)


def decode_attention_ref(
    q: torch.Tensor,
    kv: PagedKv,
    sm_scale: float,
    *,
    logit_cap: float = 0.0,
    num_kv_splits: int = 8,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """One query token per request against its cached tokens. See `decode_attention`.

    q: [batch, num_heads, head_dim]; returns [batch, num_heads, v_head_dim] in q's dtype.
    num_kv_splits is accepted for signature parity and ignored.
    """
    del num_kv_splits
    if out is None:
        out = q.new_empty(q.shape[0], q.shape[1], kv.v_buffer.shape[-1])
    indptr = kv.kv_indptr.tolist()
    for i in range(kv.batch_size):
        slots = kv.kv_indices[indptr[i] : indptr[i + 1]].long()
        scores = _Scores(sm_scale, logit_cap)
        o = _attend(q[i : i + 1], kv.k_buffer[slots], kv.v_buffer[slots], scores)
        out[i] = o[0].to(out.dtype)
    return out


def extend_attention_ref(
    q: torch.Tensor,
    new: RaggedKv,
    prefix: PagedKv,
    sm_scale: float,
    *,
    logit_cap: float = 0.0,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """New tokens attend to their request's cached prefix (all of it) and, causally, to each other.

    q: [num_new_tokens, num_heads, head_dim]; returns [num_new_tokens, num_heads, v_head_dim].
    """
    if out is None:
        out = q.new_empty(q.shape[0], q.shape[1], new.v.shape[-1])
    qo, kvp = new.qo_indptr.tolist(), prefix.kv_indptr.tolist()
    for i in range(len(qo) - 1):
        slots = prefix.kv_indices[kvp[i] : kvp[i + 1]].long()
        num_new, num_prefix = qo[i + 1] - qo[i], len(slots)
        k = torch.cat([prefix.k_buffer[slots].float(), new.k[qo[i] : qo[i + 1]].float()])
        v = torch.cat([prefix.v_buffer[slots].float(), new.v[qo[i] : qo[i + 1]].float()])
        key_pos = torch.arange(num_prefix + num_new, device=q.device)
        query_pos = torch.arange(num_new, device=q.device) + num_prefix
        mask = key_pos[None, :] <= query_pos[:, None]
        o = _attend(q[qo[i] : qo[i + 1]], k, v, _Scores(sm_scale, logit_cap, mask))
        out[qo[i] : qo[i + 1]] = o.to(out.dtype)
    return out


def store_kv_ref(
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    loc: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
) -> None:
    """Write row t of k/v into slot loc[t] of k_buffer/v_buffer (in place). See `store_kv`."""
    k_buffer[loc.long()] = k.to(k_buffer.dtype)
    v_buffer[loc.long()] = v.to(v_buffer.dtype)


def rms_norm_ref(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    residual: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    residual_out: torch.Tensor | None = None,
) -> NormOutput:
    """RMSNorm of x (+ residual, rounded to x's dtype first), fp32 math. See `rms_norm`."""
    h = x if residual is None else (x.float() + residual.float()).to(x.dtype)
    hf = h.float()
    normed = hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()
    out = torch.empty_like(x) if out is None else out
    out.copy_(normed.to(out.dtype))
    if residual is None:
        return NormOutput(out, None)
    residual_out = torch.empty_like(x) if residual_out is None else residual_out
    residual_out.copy_(h)
    return NormOutput(out, residual_out)


def silu_and_mul_ref(x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """x [T, 2 * I] = [gate | up] -> silu(gate) * up [T, I], fp32 math, x's dtype."""
    half = x.shape[-1] // 2
    xf = x.float()
    res = torch.nn.functional.silu(xf[..., :half]) * xf[..., half:]
    out = x.new_empty(*x.shape[:-1], half) if out is None else out
    out.copy_(res.to(out.dtype))
    return out


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Neox half-rotation of the first 2 * cos.shape[-1] dims of x [T, H, D]; the rest pass."""
    half = cos.shape[-1]
    xf = x.float()
    x1, x2, rest = xf[..., :half], xf[..., half : 2 * half], xf[..., 2 * half :]
    c, s = cos[:, None, :], sin[:, None, :]
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s, rest], dim=-1)


def rotary_ref(
    positions: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    out_q: torch.Tensor | None = None,
    out_k: torch.Tensor | None = None,
) -> RotaryOutput:
    """Neox-style rotary embedding from a [max_pos, rotary_dim] = [cos | sin] cache (`rotary`)."""
    cache = cos_sin_cache[positions.long()].float()
    half = cache.shape[-1] // 2
    cos, sin = cache[:, :half], cache[:, half:]
    rq, rk = _rotate(q, cos, sin), _rotate(k, cos, sin)
    out_q = torch.empty_like(q) if out_q is None else out_q
    out_k = torch.empty_like(k) if out_k is None else out_k
    out_q.copy_(rq.to(out_q.dtype))
    out_k.copy_(rk.to(out_k.dtype))
    return RotaryOutput(out_q, out_k)


def topk_softmax_ref(
    router_logits: torch.Tensor, top_k: int, renormalize: bool, out: TopKOutput | None = None
) -> TopKOutput:
    """Softmax over experts (fp32), then the top_k largest, optionally renormalized to sum 1."""
    probs = torch.softmax(router_logits.float(), dim=-1)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(-1, keepdim=True)
    if out is None:
        return TopKOutput(weights, ids.to(torch.int32))
    out.weights.copy_(weights)
    out.ids.copy_(ids)
    return out


def grouped_gemm_ref(
    a: torch.Tensor,
    w: torch.Tensor,
    out: torch.Tensor,
    routing: AlignedRouting,
    *,
    a_row_div: int = 1,
    row_weights: torch.Tensor | None = None,
) -> torch.Tensor:
    """Block by block: out[row] = a[row // a_row_div] @ w[e]^T (* weight). See `grouped_gemm`."""
    blocks = routing.sorted_ids.view(-1, routing.block_m).long()
    for rows, expert in zip(blocks, routing.expert_ids.tolist(), strict=True):
        rows = rows[rows < out.shape[0]]
        if expert < 0 or rows.numel() == 0:
            continue
        y = a[rows // a_row_div].float() @ w[expert].float().T
        if row_weights is not None:
            y = y * row_weights[rows, None].float()
        out[rows] = y.to(out.dtype)
    return out


def fused_moe_ref(
    hidden: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk: TopKOutput
) -> torch.Tensor:
    """Loop over experts: silu(x Wg^T) * (x Wu^T) W2^T, weighted by the router, summed per token.

    hidden [T, H]; w13 [E, 2 * I, H] (gate rows then up rows); w2 [E, H, I]; topk ids [T, top_k].
    Returns [T, H] in hidden's dtype; the intermediate is rounded to hidden's dtype as the kernel's.
    """
    out = torch.zeros(hidden.shape, dtype=torch.float32, device=hidden.device)
    for e in range(w13.shape[0]):
        token, slot = torch.nonzero(topk.ids == e, as_tuple=True)
        if token.numel() == 0:
            continue
        x = hidden[token].float()
        gate_up = (x @ w13[e].float().T).to(hidden.dtype)
        inter = silu_and_mul_ref(gate_up)
        y = inter.float() @ w2[e].float().T
        out.index_add_(0, token, y * topk.weights[token, slot, None].float())
    return out.to(hidden.dtype)
