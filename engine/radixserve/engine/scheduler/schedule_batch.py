"""ScheduleBatch: the scheduler's CPU-side view of one batch, and its memory bookkeeping.

`prepare_for_extend` / `prepare_for_decode` / `prepare_for_verify` take ReqToTokenPool rows and
KV slots for the requests (evicting from the prefix cache when the allocator runs dry) and lay
out the flat input ids / positions / output slots; `to_forward_batch` turns that into device
tensors.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from radixserve.engine.forward_batch import ForwardBatch, ForwardMode
from radixserve.engine.mem_cache.allocator import BaseTokenAllocator
from radixserve.engine.mem_cache.base_prefix_cache import BasePrefixCache
from radixserve.engine.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
from radixserve.engine.scheduler.req import Req

if TYPE_CHECKING:
    from radixserve.engine.attention.base import AttentionBackend
    from radixserve.engine.forward_batch import DpAttentionMeta


class OutOfKVMemoryError(RuntimeError):
    """Admission control let through more than the pool holds: a scheduler bug."""


@dataclass(frozen=True, slots=True)
class KVContext:
    """The memory a batch allocates from; one per scheduler."""

    req_to_token_pool: ReqToTokenPool
    token_to_kv_pool: MHATokenToKVPool
    allocator: BaseTokenAllocator
    tree_cache: BasePrefixCache

    def alloc_rows(self, n: int) -> list[int]:
        rows = self.req_to_token_pool.alloc(n)
        if rows is None:
            raise OutOfKVMemoryError(f"no free ReqToTokenPool rows for {n} requests")
        return rows

    def alloc_slots(
        self, prefix_lens: list[int], seq_lens: list[int], last_locs: list[int]
    ) -> torch.Tensor:
        out = self.allocator.alloc_extend(prefix_lens, seq_lens, last_locs)
        if out is None:
            # Lazily evict unlocked cached prefixes, then retry once.
            ps = self.allocator.page_size
            need = sum(s - p for p, s in zip(prefix_lens, seq_lens, strict=True)) + ps * len(
                seq_lens
            )
            self.tree_cache.evict(need)
            out = self.allocator.alloc_extend(prefix_lens, seq_lens, last_locs)
        if out is None:
            raise OutOfKVMemoryError(
                f"KV pool exhausted: need {sum(seq_lens) - sum(prefix_lens)} slots, "
                f"{self.allocator.available_size()} free"
            )
        return out


@dataclass(eq=False, slots=True)
class ScheduleBatch:
    reqs: list[Req]
    kv: KVContext
    forward_mode: ForwardMode = ForwardMode.EXTEND
    input_ids: list[int] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)
    out_cache_loc: torch.Tensor = field(default_factory=lambda: torch.empty(0, dtype=torch.int64))
    prefix_lens: list[int] = field(default_factory=list)
    extend_lens: list[int] = field(default_factory=list)
    seq_lens: list[int] = field(default_factory=list)
    decoding_reqs: list[Req] = field(default_factory=list)  # MIXED: the running decodes
    drafts: list[list[int]] | None = None  # TARGET_VERIFY: each request's draft tokens

    @property
    def batch_size(self) -> int:
        return len(self.reqs)

    def _last_locs(self, reqs: list[Req], lens: list[int]) -> list[int]:
        rt = self.kv.req_to_token_pool.req_to_token
        return [
            int(rt[r.req_pool_idx, n - 1]) if n > 0 else -1 for r, n in zip(reqs, lens, strict=True)
        ]

    def prepare_for_extend(self) -> None:
        """Rows + slots for every request's [len(prefix_indices), len(fill_ids))."""
        self.forward_mode = ForwardMode.EXTEND
        self.drafts = None
        reqs = self.reqs
        new = [r for r in reqs if r.req_pool_idx is None]
        for r, row in zip(new, self.kv.alloc_rows(len(new)), strict=True):
            r.req_pool_idx = row
        pool = self.kv.req_to_token_pool
        self.prefix_lens = [len(r.prefix_indices) for r in reqs]
        self.seq_lens = [len(r.fill_ids) for r in reqs]
        self.extend_lens = [s - p for p, s in zip(self.prefix_lens, self.seq_lens, strict=True)]
        for r in reqs:
            assert r.req_pool_idx is not None
            pool.write(r.req_pool_idx, 0, r.prefix_indices)
        slots = self.kv.alloc_slots(
            self.prefix_lens, self.seq_lens, self._last_locs(reqs, self.prefix_lens)
        )
        self.out_cache_loc = slots
        self.input_ids, self.positions, start = [], [], 0
        for r, p, e in zip(reqs, self.prefix_lens, self.extend_lens, strict=True):
            assert r.req_pool_idx is not None
            pool.write(r.req_pool_idx, p, slots[start : start + e])
            start += e
            self.input_ids += r.fill_ids[p:]
            self.positions += range(p, p + e)
            r.kv_allocated_len = p + e

    def prepare_for_decode(self) -> None:
        """One slot per request for the last sampled token, which becomes the input."""
        self.forward_mode = ForwardMode.DECODE
        self.drafts = None
        reqs = self.reqs
        self.prefix_lens = [r.seqlen - 1 for r in reqs]
        self.seq_lens = [r.seqlen for r in reqs]
        self.extend_lens = [1] * len(reqs)
        slots = self.kv.alloc_slots(
            self.prefix_lens, self.seq_lens, self._last_locs(reqs, self.prefix_lens)
        )
        self.out_cache_loc = slots
        pool = self.kv.req_to_token_pool
        for i, r in enumerate(reqs):
            assert r.req_pool_idx is not None
            pool.write(r.req_pool_idx, self.prefix_lens[i], slots[i : i + 1])
            r.kv_allocated_len = r.seqlen
        self.input_ids = [r.last_token() for r in reqs]
        self.positions = list(self.prefix_lens)

    def prepare_for_verify(self, drafts: list[list[int]]) -> None:
        """Speculative decoding: each request's last token and its drafts as one extend over
        its KV (slots for all of them; the scheduler frees the rejected ones afterwards)."""
        self.forward_mode = ForwardMode.TARGET_VERIFY
        self.drafts = drafts
        reqs = self.reqs
        self.prefix_lens = [r.seqlen - 1 for r in reqs]
        self.extend_lens = [len(d) + 1 for d in drafts]
        self.seq_lens = [p + e for p, e in zip(self.prefix_lens, self.extend_lens, strict=True)]
        slots = self.kv.alloc_slots(
            self.prefix_lens, self.seq_lens, self._last_locs(reqs, self.prefix_lens)
        )
        self.out_cache_loc = slots
        pool = self.kv.req_to_token_pool
        self.input_ids, self.positions, start = [], [], 0
        for r, p, e, d in zip(reqs, self.prefix_lens, self.extend_lens, drafts, strict=True):
            assert r.req_pool_idx is not None
            pool.write(r.req_pool_idx, p, slots[start : start + e])
            start += e
            r.kv_allocated_len = p + e
            self.input_ids += [r.last_token(), *d]
            self.positions += range(p, p + e)

    def set_drafts(self, drafts: list[list[int]]) -> None:
        """A prepared verify's drafts, now known (a draft model filled the placeholders)."""
        self.drafts = drafts
        self.input_ids = [
            t for r, d in zip(self.reqs, drafts, strict=True) for t in (r.last_token(), *d)
        ]

    def mix_with_running(self, running: ScheduleBatch) -> None:
        """Append a decode-prepared batch as extends of length 1 (forward mode MIXED)."""
        self.forward_mode = ForwardMode.MIXED
        self.decoding_reqs = list(running.reqs)
        self.reqs = self.reqs + running.reqs
        self.input_ids = self.input_ids + running.input_ids
        self.positions = self.positions + running.positions
        self.out_cache_loc = torch.cat((self.out_cache_loc, running.out_cache_loc))
        self.prefix_lens = self.prefix_lens + running.prefix_lens
        self.extend_lens = self.extend_lens + running.extend_lens
        self.seq_lens = self.seq_lens + running.seq_lens

    def filter_batch(self, keep: list[Req] | None = None) -> None:
        """Drop finished requests (or keep exactly `keep`)."""
        self.reqs = keep if keep is not None else [r for r in self.reqs if not r.finished()]

    def merge_batch(self, other: ScheduleBatch) -> None:
        self.reqs = self.reqs + other.reqs

    def to_forward_batch(
        self,
        device: torch.device,
        attn_backend: AttentionBackend,
        dp_meta: DpAttentionMeta | None = None,
    ) -> ForwardBatch:
        def t(values: list[int]) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.int64, device=device)

        pool_idx = t([r.req_pool_idx for r in self.reqs])  # type: ignore[misc]
        max_len = max(self.seq_lens, default=0)
        kv_rows = self.kv.req_to_token_pool.req_to_token[pool_idx, :max_len].to(torch.int64)

        return ForwardBatch(
            forward_mode=self.forward_mode,
            batch_size=len(self.reqs),
            input_ids=t(self.input_ids),
            positions=t(self.positions),
            req_pool_indices=pool_idx,
            seq_lens=t(self.seq_lens),
            out_cache_loc=self.out_cache_loc.to(device),
            extend_prefix_lens_cpu=list(self.prefix_lens),
            extend_seq_lens_cpu=list(self.extend_lens),
            seq_lens_cpu=list(self.seq_lens),
            req_to_token_pool=self.kv.req_to_token_pool,
            token_to_kv_pool=self.kv.token_to_kv_pool,
            attn_backend=attn_backend,
            kv_rows=kv_rows,
            dp_meta=dp_meta,
            extend_completes_cpu=[
                n >= len(r.origin_input_ids) + len(r.output_ids)
                for r, n in zip(self.reqs, self.seq_lens, strict=True)
            ],
        )
