"""The fast PyTorch backend (CPU default): GQA-grouped attention, K/V gathered once per layer.

Decode: the query heads that share a KV head are folded into the query-length axis
(q `[B, Hkv, G, D]` against K/V `[B, Hkv, L, D]`), so one SDPA call per layer attends the
whole batch without repeating K/V per query head; K/V are read from the pool with one
`index_select` over slot indices that `init_forward_metadata` flattens once per forward
(padding points at slot 0, masked out by a bias built once per forward as well).
Extend: one SDPA call per request with `enable_gqa` (no repeated K/V either); a request
without a cached prefix uses the causal kernel without an explicit mask. The requests of an
extend-like batch that add one token (the decodes of a MIXED batch) go through the batched
decode path together.

With the C++ kernel (`kernels/cpu/paged_attention.py`, built where a compiler is) and CPU
tensors, the one-token rows go through one kernel call per layer instead: it reads K/V from
the pool's slots in place (no gather, no padding mask). The multi-token extends (a prefill,
a chunk over the earlier chunks, an extend over a cached prefix) go through its tiled
flash-style entry, all of a forward's in one call (`flash_extend.h`: AVX-512, bf16 on
VDPBF16PS): 5x SDPA's speed at 2k-8k tokens (docs/long-prompts.md). SDPA stays where the
kernel has no tiled path (no AVX-512, a head dim it does not compile, `tiled_extend=False`),
and the PyTorch decode path where the kernel is missing or the tensors don't suit it.

Deterministic inference (`deterministic=True`, which needs the kernel): every query token,
of a prefill chunk, an extend over a cached prefix or a decode, is one row of the kernel's
plain entry, which computes each row alone in a fixed order. A token's attention is then the
same bits whatever else ran in its forward, whether its prefix came from the cache, and
wherever a chunk boundary fell; SDPA (blocked by the query count) and the shared-prefix
entries (split at the prefix) are not used. docs/determinism.md gives its cost.

MLA layers (absorbed DeepSeek attention: one latent KV head, values its first kv_lora_rank
columns) take the C++ MLA decode kernel (`kernels/cpu/mla_decode.py`) for their one-token rows
instead, also under deterministic inference (it computes each row alone); their extends take
SDPA per request (the shared-prefix paths assume values as wide as keys).

The reference backend (`torch_backend.py`) computes the same attention; tests compare them.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F

from radixserve.engine.attention import shared_prefix
from radixserve.engine.attention.base import AttentionBackend
from radixserve.engine.attention.shared_prefix import PrefixGroup
from radixserve.engine.forward_batch import AttentionLayer, ForwardBatch
from radixserve.kernels.cpu.mla_decode import MlaDecodeKernel
from radixserve.kernels.cpu.paged_attention import (
    SHARED_BLOCK,
    SHARED_MAX_KEYS,
    ExtendRequests,
    PagedAttentionKernel,
)


@dataclass(frozen=True, slots=True)
class DecodeRows:
    """The one-token requests of a forward: which, their K/V slots and the padding mask."""

    req_index: torch.Tensor  # [b] int64 rows of the batch (token index = query index)
    token_index: torch.Tensor  # [b] int64 positions of their query in q
    slots: torch.Tensor  # [B, max_len] int64 the batch's kv_rows (the kernel reads these)
    seq_lens: torch.Tensor  # [b] int64 keys each attends
    flat_slots: torch.Tensor  # [b · L] int64, slot 0 beyond each seq_len
    max_len: int
    mask: torch.Tensor  # [b, 1, 1, L] bool, True = attend
    shared: shared_prefix.DecodePrefix | None = None  # rows sharing a prefix (AMX kernel)


@dataclass(frozen=True, slots=True)
class ExtendRow:
    """One multi-token request of an extend-like batch, with what every layer reuses."""

    q_start: int
    extend: int
    slots: torch.Tensor  # [prefix + extend] int64 KV slots
    # [extend, prefix + extend] bool for SDPA; None: causal from position 0, or not built
    # because the tiled kernel attends the row (SDPA builds it if it runs after all)
    mask: torch.Tensor | None
    row: int = 0  # the request's index in the batch (its row of the slot table)

    @property
    def prefix(self) -> int:
        return self.slots.numel() - self.extend


@dataclass(frozen=True, slots=True)
class TiledExtends:
    """The extend rows that go through the kernel's tiled entry together, one call a layer:
    `members` index meta.extend_reqs, `table` is the batch's slot table."""

    members: tuple[int, ...]
    reqs: ExtendRequests
    table: torch.Tensor  # [B, L] int64


@dataclass(frozen=True, slots=True)
class GroupRows:
    """A shared-prefix group's query tokens as rows of the C++ kernel (AMX shared entry):
    token t reads its member's slots `table[kv_row[t], :kv_len[t]]` (causal), the first
    `prefix.numel()` of which are the group's shared slots, cut to whole kernel blocks."""

    table: torch.Tensor  # [members, L] int64
    kv_row: torch.Tensor  # [N] int64
    kv_len: torch.Tensor  # [N] int64
    prefix: torch.Tensor  # [P] int64
    rows: torch.Tensor  # [N] int64 = arange(N): every token is a member


@dataclass(frozen=True, slots=True)
class ForwardMetadata:
    decode: DecodeRows | None
    extend_reqs: tuple[ExtendRow, ...]
    prefix_groups: tuple[PrefixGroup, ...] = ()  # CPU: extend rows sharing a cached prefix
    group_rows: tuple[GroupRows | None, ...] = ()  # per prefix group, where the kernel runs it
    tiled: TiledExtends | None = None  # the extend rows outside groups, for the tiled kernel


def _decode_rows(fb: ForwardBatch, rows: list[int], token_index: list[int]) -> DecodeRows:
    device = fb.seq_lens.device
    req_index = torch.tensor(rows, dtype=torch.int64, device=device)
    max_len = max(fb.seq_lens_cpu[i] for i in rows)
    all_slots = slots = fb.req_kv_rows(max_len)
    lens = fb.seq_lens
    if len(rows) != fb.batch_size:
        slots, lens = slots[req_index], lens[req_index]
    valid = torch.arange(max_len, device=device)[None, :] < lens[:, None]
    flat = torch.where(valid, slots, torch.zeros_like(slots)).reshape(-1)
    return DecodeRows(
        req_index=req_index,
        token_index=torch.tensor(token_index, dtype=torch.int64, device=device),
        slots=all_slots,
        seq_lens=lens.to(torch.int64),
        flat_slots=flat,
        max_len=max_len,
        mask=valid[:, None, None, :],
    )


def _causal_mask(prefix: int, ext: int, device: torch.device) -> torch.Tensor:
    """Query j sits at absolute position prefix + j and sees keys 0..prefix + j."""
    return torch.ones(ext, prefix + ext, dtype=torch.bool, device=device).tril(prefix)


def _extend_row(  # noqa: PLR0913 - the row's parts
    slots: torch.Tensor, start: int, prefix: int, ext: int, row: int, with_mask: bool
) -> ExtendRow:
    mask = _causal_mask(prefix, ext, slots.device) if with_mask and prefix > 0 else None
    return ExtendRow(start, ext, slots.long(), mask, row)


def _tiled_extends(
    extends: list[ExtendRow], groups: tuple[PrefixGroup, ...], table: torch.Tensor
) -> TiledExtends | None:
    """The extend rows outside the prefix groups, as the tiled kernel's requests."""
    grouped = {i for g in groups for i in g.members}
    members = tuple(i for i in range(len(extends)) if i not in grouped)
    if not members:
        return None
    rows = [extends[i] for i in members]
    reqs = ExtendRequests.of(
        [r.row for r in rows], [r.q_start for r in rows], [r.prefix for r in rows],
        [r.extend for r in rows],
    )  # fmt: skip
    return TiledExtends(members, reqs, table.to(torch.int64).contiguous())


def _every_token_rows(fb: ForwardBatch, fallback: bool = False) -> DecodeRows:
    """Every new token of an extend-like batch as a kernel row: token j of request i reads
    the first prefix_i + j + 1 slots of row i (deterministic inference, a verify's drafts).
    `fallback`: also lay out the PyTorch path's slots and mask ([T, L]: small batches only),
    for where the kernel does not take the tensors."""
    kv_row: list[int] = []
    kv_len: list[int] = []
    for i, (prefix, ext) in enumerate(
        zip(fb.extend_prefix_lens_cpu, fb.extend_seq_lens_cpu, strict=True)
    ):
        kv_row += [i] * ext
        kv_len += range(prefix + 1, prefix + ext + 1)
    device = fb.seq_lens.device
    tokens = torch.arange(len(kv_row), dtype=torch.int64, device=device)
    req_index = torch.tensor(kv_row, dtype=torch.int64, device=device)
    lens = torch.tensor(kv_len, dtype=torch.int64, device=device)
    max_len = max(kv_len, default=0)
    slots = fb.req_kv_rows(max(fb.seq_lens_cpu))
    flat, mask = tokens, torch.empty(0, dtype=torch.bool, device=device)
    if fallback:  # each token's row of slots, cut at its own length
        mine = slots[req_index, :max_len]
        valid = torch.arange(max_len, device=device)[None, :] < lens[:, None]
        flat = torch.where(valid, mine, torch.zeros_like(mine)).reshape(-1)
        mask = valid[:, None, None, :]
    return DecodeRows(
        req_index=req_index,
        token_index=tokens,
        slots=slots,
        seq_lens=lens,
        flat_slots=flat,  # without `fallback` unused: the kernel reads `slots`
        max_len=max_len,
        mask=mask,
    )


def build_metadata(
    fb: ForwardBatch,
    deterministic: bool = False,
    tiled: bool = False,
    groups: bool = True,
    kernel_rows: bool = False,
) -> ForwardMetadata:
    """`tiled`: the kernel's tiled entry will attend the extend rows outside prefix groups
    (CPU tensors only; their SDPA masks are then not built). `groups`: look for extends
    sharing a cached prefix (CPU tensors only). `kernel_rows`: the kernel will take the rows
    of a speculative verify (CPU tensors)."""
    # A verify's every token is a kernel row, as each would be when decoded one at a time:
    # the drafts a greedy decode would have made are accepted with the same logits' argmax.
    verify = kernel_rows and fb.forward_mode.is_target_verify()
    if (deterministic or verify) and not fb.forward_mode.is_decode():
        return ForwardMetadata(_every_token_rows(fb, fallback=verify), ())
    if fb.forward_mode.is_decode():
        rows = list(range(fb.batch_size))
        return ForwardMetadata(_decode_rows(fb, rows, rows), ())
    singles: list[int] = []
    single_tokens: list[int] = []
    extends: list[ExtendRow] = []
    kv_rows = fb.req_kv_rows(max(fb.seq_lens_cpu))
    tiled = tiled and kv_rows.device.type == "cpu"
    completes = fb.extend_completes_cpu
    start = 0
    for i, (prefix, ext) in enumerate(
        zip(fb.extend_prefix_lens_cpu, fb.extend_seq_lens_cpu, strict=True)
    ):
        # A request's sampled token (the last of its final extend) is a kernel row, as it is
        # when the same prompt comes back with all but that token cached: the repeat then
        # computes it in the same order over the same cached KV, so it gets the same logits
        # (SDPA's row differs in the last bits, enough to flip a bf16 near-tie). A chunk's
        # last token stays in SDPA, as in the unchunked prefill.
        last = 1 if ext > 0 and (completes is None or completes[i]) else 0
        if ext - last > 0:
            slots = kv_rows[i, : prefix + ext - last]
            extends.append(_extend_row(slots, start, prefix, ext - last, i, not tiled))
        if last:
            singles.append(i)
            single_tokens.append(start + ext - 1)
        start += ext
    decode = _decode_rows(fb, singles, single_tokens) if singles else None
    found: tuple[PrefixGroup, ...] = ()
    if groups and kv_rows.device.type == "cpu" and len(extends) >= shared_prefix.MIN_MEMBERS:
        found = shared_prefix.find_groups(
            [r.slots[: r.slots.numel() - r.extend] for r in extends],
            [r.q_start for r in extends],
            [r.extend for r in extends],
        )
    tiled_rows = _tiled_extends(extends, found, kv_rows) if tiled else None
    return ForwardMetadata(decode, tuple(extends), found, tiled=tiled_rows)


class GroupedAttnBackend(AttentionBackend):
    """`kernel`: the C++ paged attention for the one-token rows and, with `tiled_extend`
    where its build has the tiled entry, the multi-token extends (None: PyTorch only);
    `mla_kernel`: the C++ MLA decode for the one-token rows of MLA layers (values narrower
    than keys); `deterministic`: every token through a kernel's rows (module docstring)."""

    def __init__(
        self,
        kernel: PagedAttentionKernel | None = None,
        deterministic: bool = False,
        tiled_extend: bool = True,
        mla_kernel: MlaDecodeKernel | None = None,
    ) -> None:
        if deterministic and kernel is None:
            raise ValueError("deterministic attention needs the C++ paged kernel (not built)")
        self._kernel = kernel
        self._mla_kernel = mla_kernel
        self._deterministic = deterministic
        self._tiled = (
            tiled_extend and kernel is not None and kernel.has_extend and not deterministic
        )
        # Extends sharing a cached prefix: attended together where the prefix goes on AMX
        # tiles; without AMX each through the tiled entry (faster than the cascade's SDPA).
        self._groups = not self._tiled or (kernel is not None and kernel.has_shared)
        self._meta: ForwardMetadata | None = None

    def init_forward_metadata(self, forward_batch: ForwardBatch) -> None:
        on_cpu = forward_batch.seq_lens.device.type == "cpu"
        kernel_rows = self._kernel is not None and on_cpu
        meta = build_metadata(
            forward_batch, self._deterministic, self._tiled, self._groups, kernel_rows
        )
        verify = forward_batch.forward_mode.is_target_verify()
        if self._kernel is None or not self._kernel.has_shared or self._deterministic or verify:
            self._meta = meta
            return
        if meta.prefix_groups:
            rows_of = tuple(_group_rows(g, meta) for g in meta.prefix_groups)
            meta = replace(meta, group_rows=rows_of)
        rows = meta.decode
        if rows is not None:
            table = rows.slots  # a DECODE batch: every row is a one-token row
            if table.shape[0] != rows.req_index.numel():  # MIXED: its one-token rows only
                table = table.index_select(0, rows.req_index)
            found = shared_prefix.find_decode_prefix(
                table, rows.seq_lens.tolist(), SHARED_BLOCK, SHARED_MAX_KEYS
            )
            if found is not None:
                meta = replace(meta, decode=replace(rows, shared=found))
        self._meta = meta

    def _decode(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        layer: AttentionLayer,
        rows: DecodeRows,
    ) -> torch.Tensor:
        """q [b, Hq·D] (one token per request, rows may be strided) → [b, Hq, Dv]."""
        q3 = q.unflatten(1, (layer.num_heads, layer.head_dim))
        if layer.v_head_dim != layer.head_dim:  # absorbed MLA: one latent KV head
            return self._mla_decode(q, q3, k_cache, v_cache, layer, rows)
        if self._deterministic:
            assert self._kernel is not None  # checked in __init__
            if not PagedAttentionKernel.supports(q3, k_cache, rows.slots):
                raise RuntimeError(
                    f"deterministic attention: the paged kernel does not take q {q3.dtype} "
                    f"{tuple(q3.stride())}, KV {k_cache.dtype}"
                )
            return self._kernel(
                q3, k_cache, v_cache, rows.slots, rows.req_index, rows.seq_lens, layer.scaling
            )
        if self._kernel is not None and PagedAttentionKernel.supports(q3, k_cache, rows.slots):
            args = (q3, k_cache, v_cache, rows.slots, rows.req_index, rows.seq_lens, layer.scaling)
            if rows.shared is not None:
                out = self._kernel.shared(*args, rows.shared.slots, rows.shared.members)
                if out is not None:
                    return out
            return self._kernel(*args)
        return _grouped_decode(q, k_cache, v_cache, layer, rows)

    def _mla_decode(  # noqa: PLR0913 - one argument per input of the call
        self,
        q: torch.Tensor,
        q3: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        layer: AttentionLayer,
        rows: DecodeRows,
    ) -> torch.Tensor:
        """The MLA kernel where it runs (each row alone, so deterministic too), else SDPA."""
        kernel = self._mla_kernel
        if kernel is not None and MlaDecodeKernel.supports(q3, k_cache, rows.slots):
            return kernel(
                q3, k_cache, layer.v_head_dim, rows.slots, rows.req_index, rows.seq_lens,
                layer.scaling,
            )  # fmt: skip
        if self._deterministic:
            raise RuntimeError(
                f"deterministic attention: the MLA decode kernel does not take q {q3.dtype} "
                f"{tuple(q3.stride())}, KV {k_cache.dtype} (or was not built)"
            )
        return _grouped_decode(q, k_cache, v_cache, layer, rows)

    def _write_kv(
        self, k: torch.Tensor, v: torch.Tensor, layer: AttentionLayer, fb: ForwardBatch
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The kernel's row copy where the pool suits it (CPU, one dtype), else the base's."""
        if self._kernel is not None:
            pool = fb.token_to_kv_pool
            k_cache, v_cache = pool.get_kv_buffer(layer.layer_id)
            if self._kernel.store(k, v, k_cache, v_cache, fb.out_cache_loc):
                return k_cache, v_cache
        return super()._write_kv(k, v, layer, fb)

    def _extend_group_kernel(  # noqa: PLR0913 - one argument per input of the call
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        group: PrefixGroup,
        rows: GroupRows,
        layer: AttentionLayer,
    ) -> torch.Tensor | None:
        """The group's tokens through the kernel's shared entry ([N, Hq, D] in q_index order),
        or None where it does not apply (dtype, layout: the flash cascade runs instead)."""
        assert self._kernel is not None
        qg = q.index_select(0, group.q_index)
        if not PagedAttentionKernel.supports(qg, k_cache, rows.table):
            return None
        return self._kernel.shared(
            qg, k_cache, v_cache, rows.table, rows.kv_row, rows.kv_len, layer.scaling,
            rows.prefix, rows.rows,
        )  # fmt: skip

    def _metadata(self, fb: ForwardBatch) -> ForwardMetadata:
        if self._meta is None:
            raise RuntimeError("attention: init_forward_metadata must run before the forward")
        return self._meta

    def forward_decode(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        layer: AttentionLayer,
        forward_batch: ForwardBatch,
    ) -> torch.Tensor:
        meta = self._metadata(forward_batch)
        k_cache, v_cache = self._write_kv(k, v, layer, forward_batch)
        assert meta.decode is not None
        out = self._decode(q, k_cache, v_cache, layer, meta.decode)
        return out.reshape(-1, layer.num_heads * layer.v_head_dim)

    def forward_extend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        layer: AttentionLayer,
        forward_batch: ForwardBatch,
    ) -> torch.Tensor:
        fb = forward_batch
        meta = self._metadata(fb)
        k_cache, v_cache = self._write_kv(k, v, layer, fb)
        q = q.view(-1, layer.num_heads, layer.head_dim)
        out = q.new_empty((q.shape[0], layer.num_heads, layer.v_head_dim))
        if meta.decode is not None:
            dq = q.index_select(0, meta.decode.token_index)
            out[meta.decode.token_index] = self._decode(
                dq.flatten(1), k_cache, v_cache, layer, meta.decode
            )
        done: set[int] = set()
        # the tiled and shared-prefix paths assume values as wide as keys (not MLA's latent rows)
        full_width = layer.v_head_dim == layer.head_dim
        tiled = meta.tiled if full_width else None
        if tiled is not None and self._kernel is not None:
            args = (q, k_cache, v_cache, tiled.table, tiled.reqs, layer.scaling, out)
            if self._kernel.extend(*args):
                done.update(tiled.members)
        groups = meta.prefix_groups if full_width else ()
        for i, group in enumerate(groups):
            got = None
            if meta.group_rows and (rows := meta.group_rows[i]) is not None:
                got = self._extend_group_kernel(q, k_cache, v_cache, group, rows, layer)
            if got is None:
                got = _extend_group(q, k_cache, v_cache, group, meta, layer)
            out[group.q_index] = got
            done.update(group.members)
        for i, req in enumerate(meta.extend_reqs):
            if i in done:
                continue
            end = req.q_start + req.extend
            out[req.q_start : end] = _extend_one(q[req.q_start : end], k_cache, v_cache, req, layer)
        return out.view(-1, layer.num_heads * layer.v_head_dim)


def _group_rows(group: PrefixGroup, meta: ForwardMetadata) -> GroupRows | None:
    """The group's tokens as kernel rows, or None when its shared prefix is under a block."""
    shared = min(group.slots.numel(), SHARED_MAX_KEYS)
    shared -= shared % SHARED_BLOCK
    if shared == 0:
        return None
    reqs = [meta.extend_reqs[i] for i in group.members]
    width = max(r.slots.numel() for r in reqs)
    table = torch.zeros(len(reqs), width, dtype=torch.int64)
    kv_row: list[int] = []
    kv_len: list[int] = []
    for m, r in enumerate(reqs):
        n = r.slots.numel()
        table[m, :n] = r.slots
        kv_row += [m] * r.extend
        kv_len += range(n - r.extend + 1, n + 1)  # token j of the new ones sees prefix + j + 1
    return GroupRows(
        table,
        torch.tensor(kv_row, dtype=torch.int64),
        torch.tensor(kv_len, dtype=torch.int64),
        group.slots[:shared].contiguous(),
        torch.arange(len(kv_row), dtype=torch.int64),
    )


def _grouped_decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    layer: AttentionLayer,
    rows: DecodeRows,
) -> torch.Tensor:
    """q [b, Hq·D] (one token per request) → [b, Hq, Dv]."""
    b, hkv, d, dv = rows.req_index.numel(), layer.num_kv_heads, layer.head_dim, layer.v_head_dim
    groups = layer.num_heads // hkv
    ki = k_cache.index_select(0, rows.flat_slots).view(b, rows.max_len, hkv, d).transpose(1, 2)
    vi = v_cache.index_select(0, rows.flat_slots).view(b, rows.max_len, hkv, dv).transpose(1, 2)
    qi = q.reshape(b, hkv, groups, d)
    o = F.scaled_dot_product_attention(
        qi, ki.to(q.dtype), vi.to(q.dtype), attn_mask=rows.mask, scale=layer.scaling
    )
    return o.reshape(b, layer.num_heads, dv)


def _extend_group(  # noqa: PLR0913 - one argument per input of the call
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    group: PrefixGroup,
    meta: ForwardMetadata,
    layer: AttentionLayer,
) -> torch.Tensor:
    """The members of one shared-prefix group: [N, Hq, D] in the group's q_index order."""
    scale = layer.scaling
    o_pre, lse_pre = shared_prefix.attend_prefix(q, k_cache, v_cache, group, scale)
    shared = group.slots.numel()
    reqs = [meta.extend_reqs[i] for i in group.members]
    own_prefix = [r.slots.numel() - r.extend - shared for r in reqs]
    rows = [torch.arange(r.q_start, r.q_start + r.extend) for r in reqs]
    if not any(own_prefix):
        o_own, lse_own = shared_prefix.attend_new_only(
            q, k_cache, v_cache, [r.slots[shared:] for r in reqs], rows, scale
        )
    else:
        parts = [
            shared_prefix.attend_own(q[rows_i], k_cache, v_cache, r.slots[shared:], p, scale)
            for r, p, rows_i in zip(reqs, own_prefix, rows, strict=True)
        ]
        o_own = torch.cat([o for o, _ in parts])
        lse_own = torch.cat([lse for _, lse in parts])
    return shared_prefix.merge(o_pre, lse_pre, o_own, lse_own)


def _extend_one(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    req: ExtendRow,
    layer: AttentionLayer,
) -> torch.Tensor:
    """One request's new queries [ext, Hq, D] over its prefix + new keys → [ext, Hq, Dv]."""
    ki = k_cache.index_select(0, req.slots).transpose(0, 1).unsqueeze(0).to(q.dtype)
    vi = v_cache.index_select(0, req.slots).transpose(0, 1).unsqueeze(0).to(q.dtype)
    qi = q.transpose(0, 1).unsqueeze(0)
    mask = req.mask
    if mask is None and req.prefix > 0:  # left out for the tiled kernel, which did not run
        mask = _causal_mask(req.prefix, req.extend, q.device)
    o = F.scaled_dot_product_attention(
        qi,
        ki,
        vi,
        attn_mask=mask,
        is_causal=mask is None,
        scale=layer.scaling,
        enable_gqa=True,
    )
    return o[0].transpose(0, 1)
