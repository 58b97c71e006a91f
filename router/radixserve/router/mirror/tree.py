"""MirrorTree: one rank's radix tree, rebuilt exactly from its KV events.

The tree is keyed by token ids only; block hashes are opaque names used to find where a new
block hangs (its parent) and which block a removal means. It trusts no hash scheme, so it works
for any engine that sends token ids with its BlockStored events (ours, stock SGLang).

Layout, chosen for the router's hot path (`match_prefix` on every request):
- Tokens are kept as bytes, 4 per token (`array('I')`), so comparing a node's whole segment
  with the query is one memcmp (`bytes.startswith(key, pos)`), never a Python loop per token.
- The tree is compressed: a node holds a run of pages with no branching, children are keyed
  by their first page. At page size 1 (every token a block) a 2000-token prompt that follows
  one cached chain costs one dict lookup and one memcmp, not 2000 steps.
- The shape is canonical: a node with a single child is merged with it, so the tree depends
  only on the set of cached blocks, not on the order they arrived in.
- `_where[hash]` is the node holding a block; a node's `hashes` has one hash per page.

Events:
- BlockStored: each page hangs below its parent block (None: the root), splitting the parent's
  node when the parent page is mid-node. A page whose parent is unknown is an *orphan*: it waits
  in a bounded FIFO (`max_orphans` blocks) for its parent and is attached when the parent
  arrives; the oldest orphans are dropped when the FIFO is full (their parent never came: the
  mirror missed history). A page already stored, or a different hash for the same tokens at the
  same place, is ignored.
- BlockRemoved: the block goes, and with it everything below it. Our engine evicts leaf-first,
  but it reports a leaf node's pages first-to-last, so the first removal takes the whole tail
  and the later ones find nothing (ignored); an unknown hash is ignored too.
- AllBlocksCleared: empty.
Memory is bounded by what the rank holds plus the orphan FIFO.
"""

from __future__ import annotations

from array import array
from collections.abc import Mapping, Sequence
from typing import Protocol

from radixserve.protocol.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVCacheEvent,
)

TOKEN_BYTES = 4
DEFAULT_MAX_ORPHANS = 4096
assert array("I").itemsize == TOKEN_BYTES


def encode_tokens(tokens: Sequence[int], field: str = "tokens") -> bytes:
    """Token ids → bytes, 4 per token, the key format of the mirror and approximate trees."""
    try:
        return array("I", tokens).tobytes()
    except (OverflowError, TypeError) as exc:
        raise ValueError(f"{field}: token ids must be integers in [0, 2**32): {exc}") from None


def decode_tokens(q: bytes) -> list[int]:
    """`encode_tokens`' inverse."""
    ids = array("I")
    ids.frombytes(q)
    return ids.tolist()


class _Keyed(Protocol):
    """A node of either tree as `match_bytes` reads it (read-only, so both node types fit)."""

    @property
    def key(self) -> bytes | bytearray: ...

    @property
    def children(self) -> Mapping[bytes, _Keyed]: ...


def match_bytes(root: _Keyed, q: bytes, page_bytes: int) -> int:
    """Bytes of the longest prefix of q, in whole pages, spelled by a path from root."""
    end = len(q) - len(q) % page_bytes
    pos = 0
    children = root.children
    while pos < end:
        child = children.get(q[pos : pos + page_bytes])
        if child is None:
            break
        key = child.key
        if q.startswith(key, pos):  # key is whole pages, so this also stays within `end`
            pos += len(key)
            children = child.children
            continue
        return pos + common_pages(key, q, pos, end, page_bytes)
    return pos


def common_pages(key: bytes | bytearray, q: bytes, pos: int, end: int, page_bytes: int) -> int:
    """Bytes of the common whole-page prefix of key and q[pos:end], knowing the first page
    matches: a binary search of memcmps, so a long node costs O(log n) compares."""
    lo, hi = 1, min(len(key), end - pos) // page_bytes
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if q.startswith(key[: mid * page_bytes], pos):
            lo = mid
        else:
            hi = mid - 1
    return lo * page_bytes


class _Node:
    __slots__ = ("children", "hashes", "key", "parent")

    def __init__(self, key: bytearray, hashes: list[int], parent: _Node | None) -> None:
        self.key = key  # whole pages, TOKEN_BYTES per token
        self.hashes = hashes  # one block hash per page of key
        self.parent = parent
        self.children: dict[bytes, _Node] = {}


class MirrorTree:
    """Exact token-keyed radix tree of one rank, fed by `apply(event)`."""

    def __init__(self, page_size: int, max_orphans: int = DEFAULT_MAX_ORPHANS) -> None:
        if not isinstance(page_size, int) or page_size < 1:
            raise ValueError(f"page_size: must be an integer ≥ 1, got {page_size!r}")
        if max_orphans < 0:
            raise ValueError(f"max_orphans: must be ≥ 0, got {max_orphans}")
        self.page_size = page_size
        self.max_orphans = max_orphans
        self._pb = page_size * TOKEN_BYTES
        self.clear()

    def clear(self) -> None:
        self._root = _Node(bytearray(), [], None)
        self._where: dict[int, _Node] = {}
        self._orphans: dict[int, tuple[int, bytes]] = {}  # hash → (parent hash, page), FIFO
        self._waiting: dict[int, list[int]] = {}  # parent hash → orphans waiting for it

    # ---- queries ------------------------------------------------------------------------------

    @property
    def num_blocks(self) -> int:
        return len(self._where)

    @property
    def num_tokens(self) -> int:
        return len(self._where) * self.page_size

    @property
    def num_orphans(self) -> int:
        return len(self._orphans)

    def cached_hashes(self) -> list[int]:
        """Hashes of every block in the tree, sorted (orphans excluded)."""
        return sorted(self._where)

    def match_prefix(self, tokens: Sequence[int]) -> int:
        """Number of leading tokens covered by whole cached blocks."""
        return self.match_encoded(encode_tokens(tokens))

    def match_encoded(self, q: bytes) -> int:
        """`match_prefix` of tokens already encoded by `encode_tokens` (shared across trees)."""
        return match_bytes(self._root, q, self._pb) // TOKEN_BYTES

    # ---- events -------------------------------------------------------------------------------

    def apply(self, event: KVCacheEvent) -> None:
        """Apply one event; a malformed BlockStored raises ValueError naming the field."""
        if isinstance(event, BlockStored):
            self._store(event)
        elif isinstance(event, BlockRemoved):
            for h in event.block_hashes:
                self._remove(h)
        elif isinstance(event, AllBlocksCleared):
            self.clear()
        else:
            raise ValueError(f"event: unknown KV event {type(event).__name__}")

    def _store(self, ev: BlockStored) -> None:
        if ev.block_size != self.page_size:
            raise ValueError(
                f"block_size: expected the rank's page size {self.page_size}, got {ev.block_size}"
            )
        if len(ev.token_ids) != len(ev.block_hashes) * self.page_size:
            raise ValueError(
                f"token_ids: expected {len(ev.block_hashes)} × {self.page_size} tokens, "
                f"got {len(ev.token_ids)}"
            )
        data, pb = encode_tokens(ev.token_ids, "token_ids"), self._pb
        parent = ev.parent_block_hash
        for i, h in enumerate(ev.block_hashes):  # several hashes: a chain of pages (vLLM style)
            self._store_block(h, parent, data[i * pb : (i + 1) * pb])
            parent = h

    def _store_block(self, h: int, parent: int | None, page: bytes) -> None:
        pending = [(h, parent, page)]
        while pending:  # a stack, not recursion: an orphan chain can be thousands of pages
            h, parent, page = pending.pop()
            if h in self._where:
                continue
            if parent is None:
                stored = self._attach(self._root, 0, h, page)
            elif (node := self._where.get(parent)) is not None:
                hashes = node.hashes
                pages = len(hashes) if hashes[-1] == parent else hashes.index(parent) + 1
                stored = self._attach(node, pages, h, page)
            else:
                self._add_orphan(h, parent, page)
                continue
            if stored:
                if h in self._orphans:  # announced earlier below another parent
                    self._drop_orphan(h)
                for child in self._waiting.pop(h, ()):
                    _, child_page = self._orphans.pop(child)
                    pending.append((child, h, child_page))

    def _attach(self, node: _Node, pages: int, h: int, page: bytes) -> bool:
        """Hang page h below the first `pages` pages of node; False when the place is taken."""
        pb = self._pb
        if pages < len(node.hashes):  # the parent page is mid-node
            if node.key[pages * pb : (pages + 1) * pb] == page:
                return False  # same tokens, another hash: keep the block we have
            node = self._split(node, pages)
        elif node is not self._root and not node.children:
            node.key += page  # a leaf grows in place: chains stay one node
            node.hashes.append(h)
            self._where[h] = node
            return True
        elif page in node.children:
            return False
        leaf = _Node(bytearray(page), [h], node)
        node.children[page] = leaf
        self._where[h] = leaf
        return True

    def _split(self, node: _Node, pages: int) -> _Node:
        """Cut node after `pages` pages; returns the upper part. The new node object takes the
        shorter side, since every hash it holds must be re-pointed in `_where`."""
        cut = pages * self._pb
        parent = node.parent
        assert parent is not None
        if len(node.hashes) - pages + len(node.children) <= pages:
            lower = _Node(node.key[cut:], node.hashes[pages:], node)
            lower.children = node.children
            for child in lower.children.values():
                child.parent = lower
            self._where.update(dict.fromkeys(lower.hashes, lower))
            del node.key[cut:], node.hashes[pages:]
            node.children = {bytes(lower.key[: self._pb]): lower}
            return node
        upper = _Node(node.key[:cut], node.hashes[:pages], parent)
        self._where.update(dict.fromkeys(upper.hashes, upper))
        parent.children[bytes(upper.key[: self._pb])] = upper  # same first page as node
        del node.key[:cut], node.hashes[:pages]
        node.parent = upper
        upper.children = {bytes(node.key[: self._pb]): node}
        return upper

    def _remove(self, h: int) -> None:
        if h in self._orphans:
            self._drop_orphan(h)
            return
        node = self._where.get(h)
        if node is None:
            return  # never stored, or already gone with an ancestor
        for child in node.children.values():
            self._drop_subtree(child)
        node.children = {}
        hashes = node.hashes
        i = len(hashes) - 1 if hashes[-1] == h else hashes.index(h)
        for gone in hashes[i:]:
            del self._where[gone]
        if i > 0:
            del node.key[i * self._pb :], hashes[i:]
            return
        parent = node.parent
        assert parent is not None
        del parent.children[bytes(node.key[: self._pb])]
        node.parent = None
        if parent is not self._root and len(parent.children) == 1:
            self._merge(parent)

    def _drop_subtree(self, top: _Node) -> None:
        stack = [top]
        while stack:
            node = stack.pop()
            for gone in node.hashes:
                del self._where[gone]
            stack.extend(node.children.values())
            node.parent = None

    def _merge(self, node: _Node) -> None:
        """Merge node with its only child (keeps the tree canonical); the cheaper side moves."""
        (child,) = node.children.values()
        if len(child.hashes) + len(child.children) <= len(node.hashes):
            node.key += child.key
            node.hashes += child.hashes
            node.children = child.children
            for grandchild in node.children.values():
                grandchild.parent = node
            self._where.update(dict.fromkeys(child.hashes, node))
            return
        parent = node.parent
        assert parent is not None
        child.key[:0] = node.key
        child.hashes[:0] = node.hashes
        child.parent = parent
        parent.children[bytes(node.key[: self._pb])] = child
        self._where.update(dict.fromkeys(node.hashes, child))
        node.parent = None

    # ---- orphans ------------------------------------------------------------------------------

    def _add_orphan(self, h: int, parent: int, page: bytes) -> None:
        if self.max_orphans == 0 or h in self._orphans:
            return
        if len(self._orphans) >= self.max_orphans:
            self._drop_orphan(next(iter(self._orphans)))
        self._orphans[h] = (parent, page)
        self._waiting.setdefault(parent, []).append(h)

    def _drop_orphan(self, h: int) -> None:
        parent, _ = self._orphans.pop(h)
        siblings = self._waiting[parent]
        siblings.remove(h)
        if not siblings:
            del self._waiting[parent]

    # ---- consistency (tests, debugging) -------------------------------------------------------

    def check_invariants(self) -> None:
        """Raise AssertionError naming the first broken structural invariant."""
        pb, seen = self._pb, 0
        stack = [self._root]
        while stack:
            node = stack.pop()
            if node is not self._root:
                assert node.hashes and len(node.key) == len(node.hashes) * pb, "node size"
                assert len(node.children) != 1, "node with a single child (not merged)"
                assert all(self._where.get(h) is node for h in node.hashes), "_where"
                seen += len(node.hashes)
            for first, child in node.children.items():
                assert child.parent is node and bytes(child.key[:pb]) == first, "child link"
                stack.append(child)
        assert seen == len(self._where), "_where holds blocks that are not in the tree"
        waiting = sorted(h for hs in self._waiting.values() for h in hs)
        assert waiting == sorted(self._orphans), "orphan bookkeeping"
        assert len(self._orphans) <= self.max_orphans, "orphan bound"
