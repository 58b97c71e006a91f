"""The scheduler's side of speculative decoding (--speculative-algorithm NGRAM | STANDALONE).

Before a decode step, `Speculator.prepare` drafts for the running requests (NGRAM: looked up
in recent text; STANDALONE: a draft model's chain, standalone_drafter.py); where any request
has drafts (and their KV slots fit), the step is a verify (`prepare_for_verify`) instead of a
decode. After it, `commit` keeps the KV of what was accepted and frees the rejected slots
at once, so the pool, the radix cache and a later retraction only ever see accepted tokens.

Requests that cannot be verified exactly get no drafts and decode as before in the same
forward (an extend of one token): constrained ones (their grammar would have to advance
through the drafts to mask each position).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from radixserve.engine.configs.server_args import ServerArgs
from radixserve.engine.configs.speculative_args import DRAFT_MODEL_ALGORITHMS
from radixserve.engine.ipc.messages import SpecLoad
from radixserve.engine.scheduler.req import Req
from radixserve.engine.scheduler.schedule_batch import KVContext, ScheduleBatch
from radixserve.engine.scheduler.standalone_drafter import StandaloneDrafter
from radixserve.engine.speculative import NgramConfig, NgramCorpus, VerifyOutput


@dataclass(slots=True)
class SpecStats:
    """Counters since start (SpecLoad on /metrics)."""

    verify_steps: int = 0
    verified_reqs: int = 0  # request-steps that had drafts
    proposed_drafts: int = 0
    accepted_drafts: int = 0
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0
    # accept_length_counts[n]: request-steps that emitted n tokens (n − 1 accepted drafts)
    accept_length_counts: list[int] = field(default_factory=list)


class Speculator:
    """NGRAM drafts for a scheduler's running requests, and the KV bookkeeping of a verify."""

    def __init__(
        self, args: ServerArgs, kv: KVContext, drafter: StandaloneDrafter | None = None
    ) -> None:
        self.kv = kv
        self.drafter = drafter  # STANDALONE; NGRAM looks drafts up in its corpus
        if (drafter is not None) != (args.speculative_algorithm in DRAFT_MODEL_ALGORITHMS):
            raise ValueError("speculative_algorithm: a draft model drafts for STANDALONE / EAGLE")
        self.num_drafts = args.draft_tokens - 1
        self.off_at = args.speculative_disable_by_batch_size
        self.corpus = NgramCorpus(
            NgramConfig(
                args.speculative_ngram_min_match_window_size,
                args.speculative_ngram_max_match_window_size,
                args.speculative_ngram_capacity,
            )
        )
        self.stats = SpecStats(accept_length_counts=[0] * (args.draft_tokens + 1))
        self._launched_at = 0.0

    def prepare(self, batch: ScheduleBatch) -> bool:
        """Make `batch` a verify of its requests' drafts; False (the batch untouched: a plain
        decode follows) when no request has any, their slots do not fit, or the batch is at
        least --speculative-disable-by-batch-size."""
        reqs = batch.reqs
        if self.off_at is not None and len(reqs) >= self.off_at:
            return False
        start = time.perf_counter()
        drafts = [self._draft(r) for r in reqs]
        ok = any(drafts) and self.fits(reqs, drafts)
        if ok:
            batch.prepare_for_verify(drafts)
            if self.drafter is not None:  # the placeholders become the draft model's chain
                self.drafter.fill(reqs, drafts)
                batch.set_drafts(drafts)
        self.stats.draft_seconds += time.perf_counter() - start
        return ok

    def _draft(self, req: Req) -> list[int]:
        """NGRAM: the corpus's continuation; STANDALONE / EAGLE: placeholders for the draft's
        chain."""
        if self.drafter is None:
            self.corpus.sync(req.rid, req.full_ids())
        if req.grammar is not None:
            return []
        if req.spec_pause > 0:  # its drafts kept failing: decode plainly for a while
            req.spec_pause -= 1
            return []
        # drafts beyond max_new_tokens could never be emitted: the bonus token comes after them
        room = min(
            req.spec_draft_len or self.num_drafts,
            req.sampling_params.max_new_tokens - len(req.output_ids) - 1,
        )
        if room <= 0:
            return []
        if self.drafter is not None:
            return [0] * room
        return self.corpus.propose(req.full_ids(), room, req.rid)

    def fits(self, reqs: list[Req], drafts: list[list[int]]) -> bool:
        """Whether the pool has the verify's slots (after evicting cached prefixes)."""
        ps = self.kv.allocator.page_size
        need = (
            sum(
                _pages(r.seqlen + len(d), ps) - _pages(r.seqlen - 1, ps)
                for r, d in zip(reqs, drafts, strict=True)
            )
            * ps
        )
        if self.kv.allocator.available_size() < need:
            self.kv.tree_cache.evict(need)
        return self.kv.allocator.available_size() >= need

    def on_launch(self) -> None:
        self._launched_at = time.perf_counter()

    def on_verified(self, reqs: list[Req], drafts: list[list[int]], out: VerifyOutput) -> None:
        """Count the verify; set each request's next draft length (`_next_length`)."""
        stats = self.stats
        stats.verify_seconds += time.perf_counter() - self._launched_at
        stats.verify_steps += 1
        for req, draft, tokens in zip(reqs, drafts, out.tokens, strict=True):
            if not draft:
                continue
            req.spec_draft_len = self._next_length(len(draft), len(tokens) - 1)
            _back_off(req, len(draft), len(tokens) - 1)
            stats.verified_reqs += 1
            stats.proposed_drafts += len(draft)
            stats.accepted_drafts += len(tokens) - 1
            stats.accept_length_counts[len(tokens)] += 1

    def _next_length(self, drafted: int, accepted: int) -> int:
        """Drafts a request gets next time: twice as many after all were accepted, else one
        more than were. A verify costs compute per token once the batch is large (the CPU), so
        a request whose drafts keep failing drafts one token, not --speculative-num-draft-tokens
        − 1; one in a copied span is back at the full length within a few steps."""
        if accepted == drafted:
            return min(2 * drafted, self.num_drafts)
        return accepted + 1

    def commit(self, req: Req) -> None:
        """After a verify appended its tokens: keep the KV of the positions before the newest
        token (which, as after any decode, has none yet) and free the slots past them. With
        pages, the page holding the last kept position stays whole (the next tokens fill it)."""
        assert req.req_pool_idx is not None
        kept = len(req.origin_input_ids) + len(req.output_ids) - 1
        end = req.kv_allocated_len
        ps = self.kv.allocator.page_size
        first_free = _pages(kept, ps) * ps
        if first_free < end:
            row = self.kv.req_to_token_pool.req_to_token[req.req_pool_idx]
            self.kv.allocator.free(row[first_free:end].clone())
        req.kv_allocated_len = min(kept, end)
        req.spec_draft_kv_len = min(req.spec_draft_kv_len, kept)  # past it: rejected tokens'

    def load(self) -> SpecLoad:
        s = self.stats
        return SpecLoad(
            verify_steps=s.verify_steps,
            verified_reqs=s.verified_reqs,
            proposed_drafts=s.proposed_drafts,
            accepted_drafts=s.accepted_drafts,
            draft_seconds=s.draft_seconds,
            verify_seconds=s.verify_seconds,
            accept_length_counts=list(s.accept_length_counts),
        )


def _pages(tokens: int, page_size: int) -> int:
    return -(-tokens // page_size)


# A request whose single draft was rejected skips drafting for this many decode steps, twice
# as many each time it happens again in a row, up to MAX_PAUSE; an accepted draft ends it.
FIRST_PAUSE = 2
MAX_PAUSE = 32


def _back_off(req: Req, drafted: int, accepted: int) -> None:
    """Sampled text that is not repeating: short n-gram matches propose drafts that are
    nearly always rejected, and each verify still computes them (measured at 32 in flight,
    temperature 1: accept length 1.03). Such a request stops drafting for a while."""
    if accepted:
        req.spec_backoff = 0
    elif drafted == 1:
        req.spec_backoff = min(2 * req.spec_backoff or FIRST_PAUSE, MAX_PAUSE)
        req.spec_pause = req.spec_backoff
