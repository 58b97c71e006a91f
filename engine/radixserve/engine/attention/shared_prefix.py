"""Extend attention over a prefix that several requests of one batch share (cascade attention).

When the radix cache serves many requests the same system prompt, their cached prefixes are
the same KV slots. Attending each request separately reads and scores that prefix once per
request, in small per-request calls. Here the prefix is attended once for all of them: the
queries of every member (the G query heads of one KV head stacked along the query axis, so
K/V are not repeated) go through one flash-attention call over the prefix, non-causal, which
also returns each row's log-sum-exp. Each member's own part (the rest of its cached prefix,
if any, and its new tokens, causal) is a second, small call; the two partial results merge
exactly by their log-sum-exps: o = o_own + (o_prefix − o_own) · sigmoid(lse_prefix − lse_own).

FlashInfer's cascade wrappers and SGLang's shared-prefix kernels do the same on GPUs. The
grouped backend uses it on CPU tensors when at least MIN_MEMBERS requests of an extend batch
share at least MIN_PREFIX cached slots; `tests/engine/attention/test_grouped_backend.py`
compares it with the reference backend.

Decode rows sharing a prefix get the same treatment inside the C++ kernel where the CPU has
AMX (`find_decode_prefix` picks the rows once per forward; `kernels/cpu/paged_attention.py`
runs them).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

MIN_PREFIX = 64  # shorter shared prefixes: the per-request path is as fast
MIN_MEMBERS = 2
_flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu


@dataclass(frozen=True, slots=True)
class PrefixGroup:
    """Requests of one forward whose first `slots.numel()` cached slots are the same."""

    slots: torch.Tensor  # [P] int64 the shared prefix's KV slots
    members: tuple[int, ...]  # indices into the batch's extend rows
    q_index: torch.Tensor  # [N] int64 the members' query rows in q, member by member


def find_groups(
    prefixes: list[torch.Tensor], q_starts: list[int], extends: list[int]
) -> tuple[PrefixGroup, ...]:
    """Group extend rows by a shared cached prefix. `prefixes[i]` are row i's cached slots."""
    by_head: dict[tuple[int, ...], list[int]] = {}
    for i, slots in enumerate(prefixes):
        if slots.numel() >= MIN_PREFIX:
            by_head.setdefault(tuple(slots[:MIN_PREFIX].tolist()), []).append(i)
    groups = []
    for members in by_head.values():
        if len(members) < MIN_MEMBERS:
            continue
        shortest = min(prefixes[i].numel() for i in members)
        rows = torch.stack([prefixes[i][:shortest] for i in members])
        same = (rows == rows[0]).all(dim=0)
        shared = int(same.numel() if bool(same.all()) else int(same.to(torch.int8).argmin()))
        q_index = torch.cat([torch.arange(q_starts[i], q_starts[i] + extends[i]) for i in members])
        groups.append(PrefixGroup(rows[0, :shared].clone(), tuple(members), q_index))
    return tuple(groups)


MIN_DECODE_MEMBERS = 4  # fewer decode rows than this fill too little of a 16-row AMX tile


@dataclass(frozen=True, slots=True)
class DecodePrefix:
    """Decode rows (indices into the forward's one-token rows) whose keys start with `slots`."""

    slots: torch.Tensor  # [P] int64, P a multiple of the kernel's block
    members: torch.Tensor  # [n] int64


def find_decode_prefix(
    rows: torch.Tensor, lens: list[int], block: int, max_keys: int
) -> DecodePrefix | None:
    """The largest set of decode rows sharing a cached prefix of at least MIN_PREFIX slots, cut
    to at most `max_keys` in whole `block`s; `rows` [b, L] are the rows' slots, `lens` how many
    each attends. Once per forward (every layer reuses it). None when fewer than
    MIN_DECODE_MEMBERS rows share one."""
    by_head: dict[tuple[int, ...], list[int]] = {}
    heads = rows[:, :MIN_PREFIX].tolist() if rows.shape[1] >= MIN_PREFIX else []
    for i, head in enumerate(heads):
        if lens[i] > MIN_PREFIX:  # the row's own query token is never in the shared part
            by_head.setdefault(tuple(head), []).append(i)
    members = max(by_head.values(), key=len, default=[])
    if len(members) < MIN_DECODE_MEMBERS:
        return None
    # A row's last key is its new token (its own slot), so at most lens - 1 can be shared.
    shortest = min(lens[i] for i in members) - 1
    index = torch.tensor(members, dtype=torch.int64)
    picked = rows.index_select(0, index)[:, :shortest]
    same = (picked == picked[0]).all(dim=0)
    shared = shortest if bool(same.all()) else int(same.to(torch.int8).argmin())
    shared = min(shared, max_keys)
    shared -= shared % block
    if shared < MIN_PREFIX:
        return None
    return DecodePrefix(picked[0, :shared].clone(), index)


def attend_prefix(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, group: PrefixGroup, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """The members' queries over the shared prefix: (out [N, Hq, D], lse [N, Hq] float32)."""
    n, hq = group.q_index.numel(), q.shape[1]
    hkv, d = k_cache.shape[1], k_cache.shape[2]
    g = hq // hkv
    kp = k_cache.index_select(0, group.slots).transpose(0, 1).unsqueeze(0)  # [1, Hkv, P, D]
    vp = v_cache.index_select(0, group.slots).transpose(0, 1).unsqueeze(0)
    # query head h = kv_head · G + j: stack the G heads of each KV head along the query axis
    qm = q.index_select(0, group.q_index).view(n, hkv, g, d)
    qg = qm.permute(1, 2, 0, 3).reshape(1, hkv, g * n, d)
    out, lse = _flash(qg, kp, vp, 0.0, False, attn_mask=None, scale=scale)
    out = out.view(hkv, g, n, d).permute(2, 0, 1, 3).reshape(n, hq, d)
    return out, lse.view(hkv, g, n).permute(2, 0, 1).reshape(n, hq)


def attend_own(  # noqa: PLR0913 - one argument per input of the call
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    own_slots: torch.Tensor,
    own_prefix: int,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One member's queries q [E, Hq, D] over its slots after the shared prefix: `own_prefix`
    cached ones (all visible) then its E new ones (causal). (out [E, Hq, D], lse [E, Hq])."""
    hq, hkv = q.shape[1], k_cache.shape[1]
    ks = k_cache.index_select(0, own_slots).repeat_interleave(hq // hkv, dim=1)
    vs = v_cache.index_select(0, own_slots).repeat_interleave(hq // hkv, dim=1)
    qs, ks, vs = (t.transpose(0, 1).unsqueeze(0) for t in (q, ks, vs))
    if own_prefix == 0:
        out, lse = _flash(qs, ks, vs, 0.0, True, attn_mask=None, scale=scale)
    else:
        ext = q.shape[0]
        # an additive mask in q's dtype (the flash op takes no bool mask)
        hidden = torch.ones(ext, own_prefix + ext, dtype=torch.bool).triu(own_prefix + 1)
        mask = torch.zeros(hidden.shape, dtype=q.dtype).masked_fill_(hidden, float("-inf"))
        out, lse = _flash(qs, ks, vs, 0.0, False, attn_mask=mask, scale=scale)
    return out[0].transpose(0, 1), lse[0].transpose(0, 1)


def attend_new_only(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    new_slots: list[torch.Tensor],
    q_rows: list[torch.Tensor],
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Every member's new tokens, causal among themselves, when no member has cached slots
    beyond the shared prefix: one batched call, rows padded to the longest member (padding
    keys come after every real query's position, so causality hides them; padded query rows
    are dropped). (out [N, Hq, D], lse [N, Hq]) in the members' order of `q_rows`."""
    hq, hkv, d = q.shape[1], k_cache.shape[1], k_cache.shape[2]
    lens = [s.numel() for s in new_slots]
    width = max(lens)
    pad = [torch.nn.functional.pad(s, (0, width - s.numel())) for s in new_slots]
    slots = torch.stack(pad).reshape(-1)  # padding reads slot 0: finite values, never seen
    b = len(new_slots)
    ks = k_cache.index_select(0, slots).view(b, width, hkv, d).repeat_interleave(hq // hkv, 2)
    vs = v_cache.index_select(0, slots).view(b, width, hkv, d).repeat_interleave(hq // hkv, 2)
    qs = q.new_zeros((b, width, hq, d))
    for i, rows in enumerate(q_rows):
        qs[i, : lens[i]] = q.index_select(0, rows)
    out, lse = _flash(
        qs.transpose(1, 2), ks.transpose(1, 2), vs.transpose(1, 2), 0.0, True,
        attn_mask=None, scale=scale,
    )  # fmt: skip
    keep = torch.cat([torch.arange(i * width, i * width + n) for i, n in enumerate(lens)])
    out = out.transpose(1, 2).reshape(b * width, hq, d).index_select(0, keep)
    return out, lse.transpose(1, 2).reshape(b * width, hq).index_select(0, keep)


def merge(
    o_prefix: torch.Tensor, lse_prefix: torch.Tensor, o_own: torch.Tensor, lse_own: torch.Tensor
) -> torch.Tensor:
    """Softmax over both key sets from the two partial results ([N, Hq, D], [N, Hq])."""
    weight = torch.sigmoid(lse_prefix - lse_own).unsqueeze(-1)
    own = o_own.float()
    return (own + (o_prefix.float() - own) * weight).to(o_own.dtype)
