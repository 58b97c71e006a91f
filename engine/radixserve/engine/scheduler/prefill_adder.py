"""PrefillAdder: decides which waiting requests join the next prefill batch, within budgets.

Budgets (tokens), as in SGLang:
- rem_total_tokens = free + evictable − Σ running reservations, where a running request
  reserves min(max_new − generated, CLIP) × new_token_ratio, and each admitted request
  reserves its extend length plus its full clipped max_new_tokens;
- cur_rem_tokens = free + evictable − tokens admitted this round (no future reservations);
- rem_input_tokens = max_prefill_tokens (the first request may exceed it);
- rem_chunk_tokens = chunked_prefill_size: a request that does not fit is cut to a page
  multiple and becomes the (single) chunked request.
Mixed decode tokens are charged against every budget up front.

A waiting request is judged on a read-only match (`PrefixPeek`); only when it is admitted does
the adder match for real: split the tree at the match, count the hit and lock the prefix. So a
request that waits many steps leaves the tree and its LFU counts as they were.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum, auto

from radixserve.engine.mem_cache.allocator import BaseTokenAllocator
from radixserve.engine.mem_cache.base_prefix_cache import BasePrefixCache, PrefixPeek
from radixserve.engine.scheduler.prefix_match import prefix_match_key
from radixserve.engine.scheduler.req import Req

CLIP_MAX_NEW_TOKENS = 4096


class AddReqResult(Enum):
    CONTINUE = auto()  # admitted; keep going
    NO_TOKEN = auto()  # out of KV memory
    OTHER = auto()  # input or chunk budget exhausted


@dataclass(frozen=True, slots=True)
class PrefillBudget:
    page_size: int
    max_prefill_tokens: int
    chunk_size: int | None
    new_token_ratio: float
    mixed_decode_tokens: int = 0


def _ceil_page(n: int, page: int) -> int:
    return -(-n // page) * page


class PrefillAdder:
    def __init__(
        self,
        budget: PrefillBudget,
        tree_cache: BasePrefixCache,
        allocator: BaseTokenAllocator,
        running_reqs: list[Req],
    ) -> None:
        self.page_size = budget.page_size
        self.tree_cache = tree_cache
        self.allocator = allocator
        mixed = budget.mixed_decode_tokens
        reserved = sum(remaining_new_tokens(r) for r in running_reqs)
        self.rem_total_token_offset = reserved * budget.new_token_ratio + mixed
        self.cur_rem_token_offset = float(mixed)
        self.rem_input_tokens = budget.max_prefill_tokens - mixed
        self.rem_chunk_tokens = None if budget.chunk_size is None else budget.chunk_size - mixed
        self.can_run_list: list[Req] = []
        self.new_chunked_req: Req | None = None

    def _available(self) -> int:
        return self.allocator.available_size() + self.tree_cache.evictable_size()

    @property
    def rem_total_tokens(self) -> float:
        return self._available() - self.rem_total_token_offset

    @property
    def cur_rem_tokens(self) -> float:
        return self._available() - self.cur_rem_token_offset

    def budget_state(self) -> AddReqResult:
        if self.rem_total_tokens <= 0 or self.cur_rem_tokens <= 0:
            return AddReqResult.NO_TOKEN
        if self.rem_input_tokens <= 0 or (
            self.rem_chunk_tokens is not None and self.rem_chunk_tokens <= 0
        ):
            return AddReqResult.OTHER
        return AddReqResult.CONTINUE

    def _update_budget(self, extend_len: int, max_new: int) -> None:
        extend_len = _ceil_page(extend_len, self.page_size)
        self.rem_total_token_offset += extend_len + max_new
        self.cur_rem_token_offset += extend_len
        self.rem_input_tokens -= extend_len
        if self.rem_chunk_tokens is not None:
            self.rem_chunk_tokens -= extend_len

    def add_chunked_req(self, req: Req) -> Req | None:
        """Continue the chunked request first; returns it if it stays chunked."""
        chunk = req.extend_input_len if self.rem_chunk_tokens is None else self.rem_chunk_tokens
        room = int(min(chunk, self.rem_total_tokens))
        truncated = req.extend_input_len > room
        if truncated:
            room = room // self.page_size * self.page_size
            if room <= 0:
                # No room this round: it stays the chunked request, with fill_ids back at
                # what has KV (the scheduler re-caches exactly that part next round).
                req.fill_ids = req.fill_ids[: len(req.prefix_indices)]
                return req
        req.extend_input_len = min(req.extend_input_len, room)
        req.fill_ids = req.fill_ids[: len(req.prefix_indices) + req.extend_input_len]
        self.can_run_list.append(req)
        self._update_budget(req.extend_input_len, 0 if truncated else remaining_new_tokens(req))
        return req if truncated else None

    def add_one_req(self, req: Req, peek: PrefixPeek | None = None) -> AddReqResult:
        """Admit `req` if the budgets allow. `peek`: its read-only match this step (peeked
        here when None). Only an admitted request is matched for real and locked."""
        if peek is None:
            peek = self.tree_cache.peek_prefix(prefix_match_key(req))
        extend_len = len(req.full_ids()) - peek.length
        max_new = remaining_new_tokens(req)
        if extend_len + max_new >= self.rem_total_tokens:
            return AddReqResult.NO_TOKEN
        real_input = _ceil_page(extend_len, self.page_size)
        if real_input >= self.rem_input_tokens and self.can_run_list:
            return AddReqResult.OTHER
        # Locking the prefix takes its evictable part out of the budget: count that honestly.
        pinned = self.tree_cache.evictable_in_match(peek)
        if extend_len + max_new >= self.rem_total_tokens - pinned:
            return AddReqResult.NO_TOKEN
        chunk = self.rem_chunk_tokens
        truncated = chunk is not None and real_input > chunk
        trunc = 0 if chunk is None else chunk // self.page_size * self.page_size
        if truncated and trunc <= 0:
            return AddReqResult.OTHER
        self._claim_prefix(req)
        # A HiCache match loads host pages back: the extend may be shorter than the peek said.
        truncated = chunk is not None and _ceil_page(req.extend_input_len, self.page_size) > chunk
        self.can_run_list.append(req)
        if not truncated:
            self._update_budget(req.extend_input_len, max_new)
            return self.budget_state()
        req.extend_input_len = trunc
        req.fill_ids = req.fill_ids[: len(req.prefix_indices) + trunc]
        self.new_chunked_req = req
        self._update_budget(trunc, 0)
        return self.budget_state()

    def _claim_prefix(self, req: Req) -> None:
        """On admission: match for real (split, hit count), lock the prefix, set up the round."""
        match = self.tree_cache.match_prefix(prefix_match_key(req))
        self.tree_cache.inc_lock_ref(match.last_node)
        req.prefix_indices, req.last_node = match.indices, match.last_node
        req.cache_protected_len = len(match.indices)  # the matched part is the tree's
        req.init_next_round_input()


def remaining_new_tokens(req: Req) -> int:
    """The tokens a request may still generate, clipped as admission budgets them."""
    remaining = req.sampling_params.max_new_tokens - len(req.output_ids)
    return min(max(remaining, 0), CLIP_MAX_NEW_TOKENS)
