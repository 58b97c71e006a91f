"""InflightOverlay: the prompt pages one rank is about to cache, because we just routed there.

An exact mirror only learns a prefix once the worker has prefilled it and published the
events; a tenant's second request that arrives meanwhile would see no match anywhere and be
sent elsewhere, to prefill the same prefix again. The overlay closes that gap: each routed
prompt is an *entry* (its whole pages) that counts as "arriving" on the chosen rank until
- the mirror holds all of its pages (`confirm`, called after each applied event batch),
- the request ends or fails (`discard`, from the lease's release),
- its TTL passes (`ttl_s`: covers events that never come), or
- newer entries push it out (`max_entries`, `max_tokens`: oldest first; bounded memory).

Layout: a compressed token-keyed trie like the mirror's (4 bytes per token, children by first
page, one memcmp per node), where each node counts the live entries through it; a node whose
count drops to 0 is cut off with its subtree. Matching is `match_bytes` on that trie.
Single-threaded: touched only on the event loop, between awaits. Never counted as cached.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from radixserve.router.mirror.tree import TOKEN_BYTES, common_pages, match_bytes

DEFAULT_INFLIGHT_TTL_S = 60.0
DEFAULT_INFLIGHT_MAX_ENTRIES = 4096
DEFAULT_INFLIGHT_MAX_TOKENS = 1 << 22


class _Node:
    __slots__ = ("children", "count", "key", "parent")

    def __init__(self, key: bytes, parent: _Node | None) -> None:
        self.key = key  # whole pages, TOKEN_BYTES per token
        self.parent = parent
        self.count = 0  # live entries whose prompt runs through this node
        self.children: dict[bytes, _Node] = {}


@dataclass(frozen=True, slots=True)
class _Entry:
    q: bytes  # the prompt's whole pages, encoded
    deadline: float  # monotonic seconds


@dataclass(frozen=True, slots=True)
class OverlayLimits:
    """How long and how much the overlay of one rank may hold."""

    ttl_s: float = DEFAULT_INFLIGHT_TTL_S
    max_entries: int = DEFAULT_INFLIGHT_MAX_ENTRIES
    max_tokens: int = DEFAULT_INFLIGHT_MAX_TOKENS

    def __post_init__(self) -> None:
        if not self.ttl_s > 0:
            raise ValueError(f"inflight_ttl_s: must be > 0, got {self.ttl_s}")
        if self.max_entries < 0 or self.max_tokens < 0:
            raise ValueError(
                f"inflight limits: must be ≥ 0, got entries={self.max_entries} "
                f"tokens={self.max_tokens}"
            )


class InflightOverlay:
    """In-flight prompts of one rank, matched like a cache but never reported as cached."""

    def __init__(
        self,
        page_size: int,
        limits: OverlayLimits | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not isinstance(page_size, int) or page_size < 1:
            raise ValueError(f"page_size: must be an integer ≥ 1, got {page_size!r}")
        self.limits = limits or OverlayLimits()
        self._pb = page_size * TOKEN_BYTES
        self._clock = clock
        self._next_id = 0
        self.clear()

    def clear(self) -> None:
        self._root = _Node(b"", None)
        self._entries: OrderedDict[int, _Entry] = OrderedDict()  # oldest first
        self._num_tokens = 0  # tokens held by trie nodes

    @property
    def num_entries(self) -> int:
        return len(self._entries)

    @property
    def num_tokens(self) -> int:
        return self._num_tokens

    def prompts(self) -> list[bytes]:
        """The live entries' encoded pages, oldest first (for `confirm` and tests)."""
        return [e.q for e in self._entries.values()]

    # ---- the router's calls -------------------------------------------------------------------

    def add(self, q: bytes) -> int:
        """Record a prompt (encoded) routed here; returns its entry id for `discard`. Only its
        whole pages count; the oldest entries go when a limit is passed."""
        entry_id = self._next_id
        self._next_id += 1
        q = q[: len(q) - len(q) % self._pb]
        if not q or self.limits.max_entries == 0:
            return entry_id
        self._expire()
        self._entries[entry_id] = _Entry(q, self._clock() + self.limits.ttl_s)
        self._insert(q)
        while self._entries and (
            len(self._entries) > self.limits.max_entries
            or self._num_tokens > self.limits.max_tokens
        ):
            self.discard(next(iter(self._entries)))
        return entry_id

    def discard(self, entry_id: int) -> None:
        """The request ended, failed or was confirmed: its pages stop arriving. Unknown: no-op."""
        entry = self._entries.pop(entry_id, None)
        if entry is not None:
            self._remove(entry.q)

    def match_encoded(self, q: bytes) -> int:
        """Tokens of the longest whole-page prefix of q that some live entry shares."""
        self._expire()
        return match_bytes(self._root, q, self._pb) // TOKEN_BYTES

    def confirm(self, cached: Callable[[bytes], int]) -> int:
        """Drop every entry whose pages `cached` (the mirror's match, in tokens) all covers;
        returns how many went."""
        done = [i for i, e in self._entries.items() if cached(e.q) * TOKEN_BYTES >= len(e.q)]
        for entry_id in done:
            self.discard(entry_id)
        return len(done)

    # ---- the trie -----------------------------------------------------------------------------

    def _expire(self) -> None:
        now = self._clock()
        while self._entries:
            entry_id, entry = next(iter(self._entries.items()))
            if entry.deadline > now:  # deadlines grow with insertion order
                return
            self.discard(entry_id)

    def _insert(self, q: bytes) -> None:
        node, pos, end = self._root, 0, len(q)
        node.count += 1
        while pos < end:
            child = node.children.get(q[pos : pos + self._pb])
            if child is None:
                leaf = _Node(q[pos:], node)
                leaf.count = 1
                node.children[q[pos : pos + self._pb]] = leaf
                self._num_tokens += (end - pos) // TOKEN_BYTES
                return
            if not q.startswith(child.key, pos):
                child = self._split(child, common_pages(child.key, q, pos, end, self._pb))
            child.count += 1
            node, pos = child, pos + len(child.key)

    def _split(self, node: _Node, nbytes: int) -> _Node:
        """Cut node after nbytes; node keeps the tail, the returned head takes its place."""
        parent = node.parent
        assert parent is not None
        head = _Node(node.key[:nbytes], parent)
        head.count = node.count
        parent.children[node.key[: self._pb]] = head
        node.key = node.key[nbytes:]
        node.parent = head
        head.children[node.key[: self._pb]] = node
        return head

    def _remove(self, q: bytes) -> None:
        """Undo one `_insert(q)`: the path exists (splits keep it; nothing merges)."""
        node, pos = self._root, 0
        node.count -= 1
        while pos < len(q):
            child = node.children[q[pos : pos + self._pb]]
            child.count -= 1
            if child.count == 0:  # its subtree only held entries through it: all gone now
                del node.children[child.key[: self._pb]]
                self._num_tokens -= self._subtree_tokens(child)
                return
            node, pos = child, pos + len(child.key)

    @staticmethod
    def _subtree_tokens(top: _Node) -> int:
        total, stack = 0, [top]
        while stack:
            node = stack.pop()
            total += len(node.key) // TOKEN_BYTES
            stack.extend(node.children.values())
        return total
