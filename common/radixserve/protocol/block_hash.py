"""The page-hash chain that names cached KV pages in events (engine emits, router checks).

Page i of a token sequence: h_i = SHA-256(h_{i-1} digest ‖ each token id as 4 bytes
little-endian); the chain starts from nothing at the root. The event hash is the first 64
bits of the digest, big-endian, as a signed int64. Because of the chaining, one hash names
the whole prefix ending at that page (SGLang's scheme, so stock SGLang events agree).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence


def hash_page(parent_digest: bytes | None, token_ids: Sequence[int]) -> bytes:
    h = hashlib.sha256()
    if parent_digest is not None:
        h.update(parent_digest)
    h.update(b"".join(int(t).to_bytes(4, "little", signed=False) for t in token_ids))
    return h.digest()


def digest_to_int64(digest: bytes) -> int:
    return int.from_bytes(digest[:8], "big", signed=True)


def hash_pages(
    token_ids: Sequence[int], page_size: int, parent_digest: bytes | None = None
) -> list[bytes]:
    """Digests of every full page of token_ids, chained from parent_digest."""
    out: list[bytes] = []
    prev = parent_digest
    for start in range(0, len(token_ids) - page_size + 1, page_size):
        prev = hash_page(prev, token_ids[start : start + page_size])
        out.append(prev)
    return out


def block_hashes(token_ids: Sequence[int], page_size: int) -> list[int]:
    """Event hashes (int64) of every full page of a sequence starting at the root."""
    return [digest_to_int64(d) for d in hash_pages(token_ids, page_size)]
