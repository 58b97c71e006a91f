"""ApproxTree: what a rank probably caches, for workers that publish no KV events.

sgl-router's fallback: remember the prompts routed to the rank in a token-keyed radix tree
and assume the worker still caches them. The tree is trimmed to a token budget, least recently
used leaves first; a leaf longer than the excess loses only its tail, so the budget is kept
exactly and the prefixes (what matching needs) survive longest.

Same byte-keyed compressed layout as MirrorTree (4 bytes per token, children by first token,
one memcmp per node). Recency is a tick per insert stamped on the whole path; leaves wait in a
heap with lazy deletion (an entry is stale when the node was touched again, grew children or
was removed), which is compacted when stale entries outnumber the nodes.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Sequence

from radixserve.router.mirror.tree import TOKEN_BYTES, common_pages, encode_tokens, match_bytes


class _Node:
    __slots__ = ("children", "key", "parent", "tick")

    def __init__(self, key: bytes, parent: _Node | None, tick: int) -> None:
        self.key = key
        self.parent = parent
        self.tick = tick
        self.children: dict[bytes, _Node] = {}


class ApproxTree:
    """Token-keyed tree of the prompts routed to one rank, LRU-trimmed to `max_tokens`."""

    def __init__(self, max_tokens: int) -> None:
        if not isinstance(max_tokens, int) or max_tokens < 0:
            raise ValueError(f"max_tokens: must be an integer ≥ 0, got {max_tokens!r}")
        self.max_tokens = max_tokens
        self.clear()

    def clear(self) -> None:
        self._root = _Node(b"", None, 0)
        self._num_tokens = 0
        self._nodes = 0
        self._tick = 0
        self._heap: list[tuple[int, int, _Node]] = []
        self._ids = itertools.count()

    @property
    def num_tokens(self) -> int:
        return self._num_tokens

    def match_prefix(self, tokens: Sequence[int]) -> int:
        """Number of leading tokens of `tokens` routed here before (and not trimmed since)."""
        return self.match_encoded(encode_tokens(tokens))

    def match_encoded(self, q: bytes) -> int:
        return match_bytes(self._root, q, TOKEN_BYTES) // TOKEN_BYTES

    def insert(self, tokens: Sequence[int]) -> None:
        """Record a prompt routed here: it becomes the most recently used path."""
        self.insert_encoded(encode_tokens(tokens))

    def insert_encoded(self, q: bytes) -> None:
        if not q:
            return
        self._tick += 1
        tick, end = self._tick, len(q)
        node, pos = self._root, 0
        while pos < end:
            node.tick = tick
            child = node.children.get(q[pos : pos + TOKEN_BYTES])
            if child is None:
                break
            if q.startswith(child.key, pos):
                node, pos = child, pos + len(child.key)
                continue
            common = common_pages(child.key, q, pos, end, TOKEN_BYTES)
            node, pos = self._split(child, common), pos + common
            break
        node.tick = tick
        if pos < end:
            self._num_tokens += (end - pos) // TOKEN_BYTES
            if node is not self._root and not node.children:
                node.key += q[pos:]  # a leaf grows in place
            else:
                leaf = _Node(q[pos:], node, tick)
                node.children[q[pos : pos + TOKEN_BYTES]] = leaf
                self._nodes += 1
                node = leaf
        if not node.children:
            self._push(node)
        self._trim()

    def _split(self, node: _Node, nbytes: int) -> _Node:
        """Cut node after nbytes; node keeps the tail (and its heap entries), returns the head."""
        parent = node.parent
        assert parent is not None
        upper = _Node(node.key[:nbytes], parent, node.tick)
        parent.children[node.key[:TOKEN_BYTES]] = upper
        node.key = node.key[nbytes:]
        node.parent = upper
        upper.children = {node.key[:TOKEN_BYTES]: node}
        self._nodes += 1
        return upper

    def _push(self, node: _Node) -> None:
        heapq.heappush(self._heap, (node.tick, next(self._ids), node))

    def _trim(self) -> None:
        heap = self._heap
        while self._num_tokens > self.max_tokens and heap:
            tick, _, node = heapq.heappop(heap)
            if node.parent is None or node.children or node.tick != tick:
                continue  # stale entry
            excess = self._num_tokens - self.max_tokens
            size = len(node.key) // TOKEN_BYTES
            if size > excess:
                node.key = node.key[: (size - excess) * TOKEN_BYTES]
                self._num_tokens -= excess
                self._push(node)
                break
            parent = node.parent
            del parent.children[node.key[:TOKEN_BYTES]]
            node.parent = None
            self._nodes -= 1
            self._num_tokens -= size
            if parent is not self._root and not parent.children:
                self._push(parent)
        if len(heap) > 2 * self._nodes + 64:
            self._compact_heap()

    def _compact_heap(self) -> None:
        leaves, stack = [], list(self._root.children.values())
        while stack:
            node = stack.pop()
            if node.children:
                stack.extend(node.children.values())
            else:
                leaves.append((node.tick, next(self._ids), node))
        heapq.heapify(leaves)
        self._heap = leaves
