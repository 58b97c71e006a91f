"""TreeNode of the radix cache: a key segment, its KV slots (device, and host under HiCache),
lock counts and access stats."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch


@dataclass(eq=False, slots=True)
class TreeNode:
    id: int
    parent: TreeNode | None = None
    key: list[int] = field(default_factory=list)
    value: torch.Tensor = field(default_factory=lambda: torch.empty(0, dtype=torch.int64))
    children: dict[int | tuple[int, ...], TreeNode] = field(default_factory=dict)
    lock_ref: int = 0
    hit_count: int = 0
    last_access_time: float = 0.0
    creation_time: float = 0.0
    # SHA-256 per full page of key; filled only when the cache records KV events or keys a
    # storage tier by them
    page_digests: list[bytes] = field(default_factory=list)
    # HiCache (hiradix_cache.py): the node's slots in the host pool when backed up there, and
    # whether its device slots were given back (then `value` is empty and the KV lives only
    # in the host pool); host_lock_ref pins the host copy while a load-back reads it
    host_value: torch.Tensor | None = None
    evicted: bool = False
    host_lock_ref: int = 0

    def __post_init__(self) -> None:
        self.creation_time = self.last_access_time = time.monotonic()

    def last_digest(self) -> bytes | None:
        """Digest of this node's last page: the chain seed of its children (None at root)."""
        return self.page_digests[-1] if self.page_digests else None
