"""Conservative admission state (`new_token_ratio`) and decode retraction.

new_token_ratio is the fraction of each running request's remaining max_new_tokens that
admission reserves. It starts at 0.7 × conservativeness, decays per decode step to a floor
(0.14 × initial) as requests prove they finish early, resets when the server goes idle, and
jumps back up after a retraction (SGLang's formula).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from radixserve.engine.mem_cache.base_prefix_cache import BasePrefixCache
from radixserve.engine.scheduler.req import Req
from radixserve.engine.scheduler.schedule_batch import ScheduleBatch

INIT_NEW_TOKEN_RATIO = 0.7
MIN_NEW_TOKEN_RATIO_FACTOR = 0.14
NEW_TOKEN_RATIO_DECAY_STEPS = 600
RETRACT_DECODE_STEPS = 20


@dataclass(slots=True)
class NewTokenRatio:
    init: float
    floor: float
    step: float
    value: float

    @classmethod
    def create(cls, conservativeness: float) -> NewTokenRatio:
        init = min(INIT_NEW_TOKEN_RATIO * conservativeness, 1.0)
        floor = min(init * MIN_NEW_TOKEN_RATIO_FACTOR, 1.0)
        return cls(init, floor, (init - floor) / NEW_TOKEN_RATIO_DECAY_STEPS, init)

    def decay(self) -> None:
        self.value = max(self.value - self.step, self.floor)

    def reset(self) -> None:
        self.value = self.init

    def after_retraction(self, remaining: list[Req]) -> None:
        decoded = sum(len(r.output_ids) for r in remaining)
        budget = sum(r.sampling_params.max_new_tokens for r in remaining)
        self.value = min(1.0, (decoded + RETRACT_DECODE_STEPS * len(remaining)) / (budget + 1))


def retract_decode(
    batch: ScheduleBatch,
    tree_cache: BasePrefixCache,
    fits: Callable[[ScheduleBatch], bool],
    keep: int = 1,
) -> list[Req]:
    """Pop requests until the next decode step fits: fewest generated tokens first, ties →
    longest prompt first. Never retracts the last `keep` requests (a PD decode passes 0: its
    rooms' pages are pinned while their KV arrives). Retracted requests lose their KV (not
    cached) but keep their outputs, and re-enter through the waiting queue."""
    order = sorted(
        batch.reqs, key=lambda r: (len(r.output_ids), -len(r.origin_input_ids)), reverse=True
    )
    retracted: list[Req] = []
    while len(order) > keep and not fits(batch):
        req = order.pop()
        retracted.append(req)
        batch.filter_batch([r for r in batch.reqs if r is not req])
        tree_cache.cache_finished_req(req, is_insert=False)
        tree_cache.evict(len(order) * RETRACT_DECODE_STEPS)
        reset_for_retract(req)
    return retracted


def reset_for_retract(req: Req) -> None:
    req.prefix_indices = torch.empty(0, dtype=torch.int64, device=req.prefix_indices.device)
    req.last_node = None
    req.cache_protected_len = 0
    req.kv_allocated_len = 0
    req.spec_draft_kv_len = 0
    req.extend_input_len = 0
    req.num_inflight = 0  # an in-flight token of a retracted request is discarded
    req.is_retracted = True
    req.retraction_count += 1
