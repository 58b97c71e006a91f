"""SchedulePolicy: the order in which waiting requests are offered to the PrefillAdder.

The names are `configs.server_args.SCHEDULE_POLICIES`: fcfs (arrival order), lof (longest
max_new_tokens first), random, and the cache-aware lpm (the default: longest cached prefix
first; FCFS above 128 waiting) and dfs-weight
(depth-first over the radix tree, heavier subtrees first, so siblings sharing a prefix run
together). Cache-aware policies also do in-batch prefix caching: of several waiting requests
sharing an uncached prefix, later ones are held back so they hit the cache after the first.
Ordering only reads the tree (`StepPrefixMatches`): no split, hit count or lock.
"""

from __future__ import annotations

import random
from collections import defaultdict

from radixserve.engine.mem_cache.base_prefix_cache import BasePrefixCache
from radixserve.engine.mem_cache.radix_cache import RadixCache
from radixserve.engine.mem_cache.tree_node import TreeNode
from radixserve.engine.scheduler.prefix_match import StepPrefixMatches
from radixserve.engine.scheduler.req import Req

LPM_FALLBACK_QUEUE_LEN = 128
IN_BATCH_CHECK_THRESHOLD = 32
IN_BATCH_DEPRIORITIZE_THRESHOLD = 32


class SchedulePolicy:
    def __init__(self, policy: str, tree_cache: BasePrefixCache, seed: int = 0) -> None:
        self.policy = policy
        self.tree_cache = tree_cache
        self.rng = random.Random(seed)

    def _active(self, queue_len: int) -> str:
        cache_aware = self.policy in ("lpm", "dfs-weight")
        if cache_aware and not isinstance(self.tree_cache, RadixCache):
            return "fcfs"  # nothing is shared, so there is nothing to be aware of
        if self.policy == "lpm" and queue_len > LPM_FALLBACK_QUEUE_LEN:
            return "fcfs"
        return self.policy

    def calc_priority(self, waiting: list[Req], matches: StepPrefixMatches) -> list[Req]:
        """Return the waiting queue in scheduling order (the input list is not modified).
        Cache-aware orders peek every request through `matches`, which changes no node."""
        active = self._active(len(waiting))
        if active == "fcfs":
            return list(waiting)
        if active == "lof":
            return sorted(waiting, key=lambda r: -r.sampling_params.max_new_tokens)
        if active == "random":
            out = list(waiting)
            self.rng.shuffle(out)
            return out
        held_back = self._held_back(waiting, matches)
        if active == "lpm":
            ordered = sorted(waiting, key=lambda r: -matches.get(r).length)
        else:
            ordered = self._dfs_weight(waiting, matches)
        return [r for r in ordered if id(r) not in held_back] + [
            r for r in ordered if id(r) in held_back
        ]

    def _held_back(self, waiting: list[Req], matches: StepPrefixMatches) -> set[int]:
        """Ids of requests to hold back: their first IN_BATCH_DEPRIORITIZE_THRESHOLD tokens,
        uncached, equal those of an earlier request that is not held back."""
        n = IN_BATCH_DEPRIORITIZE_THRESHOLD
        leading: set[tuple[int, ...]] = set()  # first n tokens of the requests let through
        held: set[int] = set()
        for req in waiting:
            if matches.get(req).length > IN_BATCH_CHECK_THRESHOLD:
                continue
            key = req.full_ids()
            head = tuple(key[:n])
            if len(key) >= n and head in leading:
                held.add(id(req))
            elif len(key) >= n:
                leading.add(head)
        return held

    def _dfs_weight(self, waiting: list[Req], matches: StepPrefixMatches) -> list[Req]:
        tree = self.tree_cache
        assert isinstance(tree, RadixCache)  # _active() falls back to fcfs without a tree
        by_node: dict[int, list[Req]] = defaultdict(list)
        nodes: dict[int, TreeNode] = {}
        for req in waiting:
            node = matches.get(req).node  # where its match ends (possibly inside the node)
            by_node[id(node)].append(req)
            nodes[id(node)] = node
        weight: dict[int, int] = defaultdict(int)
        for nid, reqs in by_node.items():
            up: TreeNode | None = nodes[nid]
            while up is not None:
                weight[id(up)] += len(reqs)
                up = up.parent
        out: list[Req] = []
        stack: list[TreeNode] = [tree.root]
        while stack:
            node = stack.pop()
            out.extend(by_node.get(id(node), []))
            children = [c for c in node.children.values() if weight.get(id(c), 0) > 0]
            # Push lighter first so the heaviest subtree is visited next.
            stack.extend(sorted(children, key=lambda c: weight[id(c)]))
        return out
