"""Eviction orders for the radix cache (`--radix-eviction-policy`): smaller key goes first."""

from __future__ import annotations

from collections.abc import Callable

from radixserve.engine.mem_cache.tree_node import TreeNode

_POLICIES: dict[str, Callable[[TreeNode], tuple[float, ...]]] = {
    "lru": lambda n: (n.last_access_time,),
    "lfu": lambda n: (n.hit_count, n.last_access_time),
    "fifo": lambda n: (n.creation_time,),
}


def eviction_key(policy: str, node: TreeNode) -> tuple[float, ...]:
    fn = _POLICIES.get(policy)
    if fn is None:
        raise ValueError(f"radix_eviction_policy: unknown {policy!r}; known: {sorted(_POLICIES)}")
    return fn(node)
