"""This step's read-only prefix matches of waiting requests (scheduler process, CPU only).

Ordering (lpm, dfs-weight) and admission both need to know how much of each waiting request is
cached. `StepPrefixMatches` peeks each request at most once per step and changes nothing in the
tree; the PrefillAdder then splits, counts hits and locks only for the requests it admits.
A memo never outlives the step that built it: the next step may see another tree.
"""

from __future__ import annotations

from radixserve.engine.managers.req import Req
from radixserve.engine.mem_cache.base_prefix_cache import BasePrefixCache, PrefixPeek


def prefix_match_key(req: Req) -> list[int]:
    """What a request may reuse from the cache: all its tokens but the last, since at least
    one token must be computed to get the logits of the next one."""
    key = req.full_ids()
    return key[: len(key) - 1]


class StepPrefixMatches:
    """Read-only matches of one scheduling step, at most one per request."""

    def __init__(self, tree_cache: BasePrefixCache) -> None:
        self.tree_cache = tree_cache
        self._by_req: dict[int, PrefixPeek] = {}

    def get(self, req: Req) -> PrefixPeek:
        """The request's match this step (peeked on first use, then remembered)."""
        peek = self._by_req.get(id(req))
        if peek is None:
            peek = self.tree_cache.peek_prefix(prefix_match_key(req))
            self._by_req[id(req)] = peek
        return peek
