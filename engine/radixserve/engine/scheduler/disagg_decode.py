"""The decode side of a prefill/decode pair: its queues in front of the running batch.

A request that names a prefill (`req.bootstrap`) lives in a room, keyed by its bootstrap_room:
1. resolve: the prefill's topology and control endpoint come from its bootstrap server; a
   mismatch (model, KV dtype, page size, TP) ends the request with an error naming both sides,
   and the prefill is told (`KVRefuse`), so neither side waits;
2. pre-allocation queue: when memory allows, a ReqToTokenPool row and KV pages for the prompt
   are reserved (after the prefix this side already caches, with
   --disaggregation-decode-enable-radix-cache) and `KVRequest` tells the prefill where to write;
3. transfer queue: waits for `KVDone`, acknowledges it, then the request joins the running
   batch with its first token, as if this side had prefilled it.
An abort or timeout in the transfer queue sends `KVAbort` and keeps the pages until the prefill
says no write can reach them (`KVDrained`, or any final word, or a timeout). A prefill that
restarted at the same address (its bootstrap server names a new session) gets its waiting
rooms' `KVRequest`s again at its new endpoints: the router may have sent it those requests.
Retraction needs nothing of this: a retracted request is recomputed here from its tokens like
any other.

Under TP the ranks allocate in lock-step, so one `KVRequest` names the same pages on every rank
with each rank's buffers and heads; rank 0 alone talks to the prefill and looks prefills up, and
each round's inputs are agreed by all ranks (`disagg_sync`).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from enum import Enum, auto
from typing import TYPE_CHECKING

import torch

from radixserve.engine.disaggregation.kv_manager import KVManager
from radixserve.engine.disaggregation.wire import (
    KVAbort,
    KVAck,
    KVDone,
    KVFailed,
    KVRefuse,
    KVRequest,
    PrefillInfo,
    ToDecode,
    Topology,
    topology_mismatch,
)
from radixserve.engine.ipc.finish_reason import FinishAbort, FinishReason
from radixserve.engine.scheduler.disagg_common import DisaggConfig, DisaggStats
from radixserve.engine.scheduler.disagg_directory import PrefillDirectory
from radixserve.engine.scheduler.disagg_sync import RankRound, RoundSync, decode_msgs
from radixserve.engine.scheduler.prefill_adder import remaining_new_tokens
from radixserve.engine.scheduler.req import Req
from radixserve.engine.scheduler.schedule_batch import ScheduleBatch

if TYPE_CHECKING:
    from radixserve.engine.scheduler.scheduler import Scheduler

logger = logging.getLogger(__name__)


class Stage(Enum):
    RESOLVE = auto()  # fetching the prefill's topology
    PREALLOC = auto()  # waiting for memory
    TRANSFER = auto()  # KVRequest sent, waiting for KVDone
    DRAIN = auto()  # ended here; pages held until the prefill confirms no write is left
    REBIND = auto()  # its prefill restarted: look it up again, then send the KVRequest again


@dataclass(eq=False, slots=True)
class DecodeRoom:
    req: Req
    address: str  # the prefill's bootstrap host:port
    since: float | None = None  # when its stage began (None: from the next round's clock)
    stage: Stage = Stage.RESOLVE
    endpoint: str = ""  # the prefill rank's control socket
    holds_kv: bool = False  # row and pages reserved (freed when the room ends)
    request: KVRequest | None = None  # what was sent (sent again after a prefill restart)


class DecodeDisagg:
    def __init__(
        self,
        scheduler: Scheduler,
        kv: KVManager,
        topology: Topology,
        config: DisaggConfig,
        sync: RoundSync,
    ) -> None:
        self.scheduler = scheduler
        self.kv = kv
        self.topology = topology
        self.config = config
        self.sync = sync
        self.ranks = sync.ranks  # every rank's KV buffers, rank order: where the prefill writes
        self.bytes_per_page = (
            sum(2 * len(r.k_ptrs) * r.item_len for r in self.ranks) * kv.layout.page_size
        )
        self.directory = PrefillDirectory(config)  # used by rank 0 only
        self.now = 0.0  # rank 0's clock at the last round: every rank times rooms by it
        self.rooms: dict[int, DecodeRoom] = {}
        self.stats = DisaggStats()

    def add(self, req: Req) -> None:
        boot = req.bootstrap
        assert boot is not None
        if boot.room in self.rooms:
            req.finished_reason = FinishAbort(
                f"bootstrap_room: room {boot.room} is already in use on this decode server", 400
            )
            return
        self.rooms[boot.room] = DecodeRoom(req, f"{boot.host}:{boot.port}")

    def pending(self) -> bool:
        return bool(self.rooms)

    # ---- the step hook ------------------------------------------------------------------------

    def poll(self) -> list[Req]:
        """Progress every room; returns requests that got their first token or ended."""
        rounds = self.sync.exchange(self._observe() if self.sync.lead else RankRound())
        lead = rounds[0]
        self.now = lead.now
        done: list[Req] = []
        for msg in decode_msgs(lead.msgs, ToDecode):
            done += self._on_message(msg)
        done += self._resolve(lead.resolved)
        done += self._preallocate()
        done += self._sweep(self.now, set(lead.dead), set(lead.restarted))
        return done

    def _observe(self) -> RankRound:
        """Rank 0: this round's messages, and what it learnt of the prefills rooms wait on."""
        resolving = {
            r.address for r in self.rooms.values() if r.stage in (Stage.RESOLVE, Stage.REBIND)
        }
        resolved = {}
        for address in resolving:
            found = self.directory.resolve(address)
            if found is not None:
                resolved[address] = found
        waiting = {r.address for r in self.rooms.values() if r.stage is not Stage.RESOLVE}
        dead, restarted = self.directory.check(waiting)
        msgs = self.kv.recv_raw()
        return RankRound(time.monotonic(), msgs, [], resolved, sorted(dead), sorted(restarted))

    def _resolve(self, resolved: dict[str, PrefillInfo | str]) -> list[Req]:
        done: list[Req] = []
        waiting = [r for r in self.rooms.values() if r.stage in (Stage.RESOLVE, Stage.REBIND)]
        for room in waiting:
            found = resolved.get(room.address)
            if found is not None:
                done += self._resolved(room, found)
        return done

    def _resolved(self, room: DecodeRoom, found: PrefillInfo | str) -> list[Req]:
        if room.stage is Stage.REBIND:
            return self._rebound(room, found)
        if isinstance(found, str):
            self.stats.bootstrap_failed += 1
            return self._end(room, FinishAbort(found, 500))
        room.endpoint = found.ranks[0].endpoint
        problem = topology_mismatch(found.topology, self.topology, room.address, self.kv.endpoint)
        if problem is not None:
            self.stats.bootstrap_failed += 1
            logger.warning("room %d refused: %s", _room(room.req), problem)
            self.kv.send(room.endpoint, KVRefuse(_room(room.req), problem))
            return self._end(room, FinishAbort(problem, 500))
        room.stage = Stage.PREALLOC
        return []

    def _rebound(self, room: DecodeRoom, found: PrefillInfo | str) -> list[Req]:
        """A restarted prefill's endpoints are known again: the room's KVRequest goes to them
        (the old process, which it went to, can write nothing more)."""
        if isinstance(found, str) or room.request is None:
            why = found if isinstance(found, str) else "the prefill restarted"
            self.stats.transfer_failed += 1
            room.req.finished_reason = FinishAbort(f"prefill {room.address}: {why}", 500)
            self._free(room)
            return [room.req]
        room.endpoint = found.ranks[0].endpoint
        self.kv.send(room.endpoint, room.request)
        room.stage, room.since = Stage.TRANSFER, None
        return []

    def _rebind(self, room: DecodeRoom) -> None:
        """Its prefill restarted: a room that asked for its KV asks again once the prefill is
        looked up again; one that did not yet asks the new one; one draining is free (the
        old process can write nothing more)."""
        if room.stage is Stage.TRANSFER:
            room.stage = Stage.REBIND
        elif room.stage is Stage.PREALLOC:
            room.stage = Stage.RESOLVE
        elif room.stage is Stage.DRAIN:
            self._free(room)

    def _preallocate(self) -> list[Req]:
        """Reserve memory for queued rooms in arrival order, stopping at the first that does
        not fit (it keeps its place). Requests the running batch retracted go first: none is
        reserved while the waiting queue holds any."""
        if self.scheduler.waiting_queue:
            return []
        for room in [r for r in self.rooms.values() if r.stage is Stage.PREALLOC]:
            if not self._reserve(room):
                break
        return []

    def _future_tokens(self) -> float:
        """What the running batch and the rooms already reserved may still generate, as
        admission budgets a running request (new_token_ratio of its remaining tokens), plus
        a page each for its next step. A reserved room's pages are pinned until its KV
        arrives (no retraction can take them), so it is admitted only within this."""
        sched = self.scheduler
        reqs = sched.running_batch.reqs
        held = [r.req for r in self.rooms.values() if r.holds_kv]
        remaining = sum(remaining_new_tokens(r) for r in (*reqs, *held))
        return sched.ratio.value * remaining + self.topology.page_size * (len(reqs) + 1)

    def _reserve(self, room: DecodeRoom) -> bool:
        sched, req = self.scheduler, room.req
        kv, ps = sched.kv, self.topology.page_size
        ids, n = req.origin_input_ids, len(req.origin_input_ids)
        match = kv.tree_cache.match_prefix(ids)
        prefix = match.indices
        kv.tree_cache.inc_lock_ref(match.last_node)
        need = (-(-n // ps) - len(prefix) // ps) * ps
        # its prompt, all it may generate (as a request admitted to a prefill), the others';
        # alone here it needs only its prompt (its length was checked against the pool)
        alone = not sched.running_batch.reqs and not any(r.holds_kv for r in self.rooms.values())
        reserve = 0.0 if alone else remaining_new_tokens(req) + self._future_tokens()
        if kv.allocator.available_size() < need + reserve:
            kv.tree_cache.evict(int(need + reserve) - kv.allocator.available_size())
        rows = None
        if kv.allocator.available_size() >= need + reserve:
            rows = kv.req_to_token_pool.alloc(1)
        if rows is None:
            kv.tree_cache.dec_lock_ref(match.last_node)
            return False
        last = [int(prefix[-1])] if len(prefix) else [-1]
        slots = kv.allocator.alloc_extend([len(prefix)], [n], last)
        assert slots is not None  # checked above
        row = rows[0]
        kv.req_to_token_pool.write(row, 0, prefix)
        kv.req_to_token_pool.write(row, len(prefix), slots)
        req.req_pool_idx, req.prefix_indices, req.last_node = row, prefix, match.last_node
        req.cache_protected_len, req.kv_allocated_len = len(prefix), n
        room.holds_kv = True
        pages = (slots[::ps] // ps).tolist()
        room.request = KVRequest(
            _room(req), self.kv.endpoint, self.topology, len(prefix), pages, self.ranks
        )
        self.kv.send(room.endpoint, room.request)
        room.stage, room.since = Stage.TRANSFER, None
        return True

    # ---- the prefill's answers ----------------------------------------------------------------

    def _on_message(self, msg: ToDecode) -> list[Req]:
        room = self.rooms.get(msg.room)
        if room is None:
            return []  # a room already ended: late words never reopen it
        if room.stage is Stage.DRAIN:  # any final word: no write of the room is left
            self._free(room)
            return []
        if isinstance(msg, KVDone) and room.stage is Stage.TRANSFER:
            return self._commit(room, msg)
        if isinstance(msg, KVFailed):
            self.stats.transfer_failed += 1
            return self._end(room, FinishAbort(f"prefill {room.address}: {msg.reason}", 500))
        return []

    def _commit(self, room: DecodeRoom, msg: KVDone) -> list[Req]:
        """The KV is here: the request joins the running batch with its first token."""
        self.kv.send(room.endpoint, KVAck(msg.room))
        del self.rooms[msg.room]
        num_bytes = msg.num_pages * self.bytes_per_page  # what this side's ranks reserved
        self.stats.count_transfer(msg.num_pages, num_bytes)
        sched, req = self.scheduler, room.req
        req.output_ids.append(msg.first_token)
        if req.return_logprob:
            req.output_token_logprobs.append(msg.logprob)
            if req.top_logprobs_num:
                req.output_top_logprobs.append(list(msg.top_logprobs))
        req.cached_tokens = msg.cached_tokens
        if req.wants_input_logprobs:  # computed by the prefill: this side computes none
            req.input_token_logprobs = list(msg.input_token_logprobs)
            req.input_top_logprobs = [list(top) for top in msg.input_top_logprobs]
            req.input_logprob_next = len(req.origin_input_ids) - 1
        req.fill_ids = list(req.origin_input_ids)
        assert req.req_pool_idx is not None
        row = sched.kv.req_to_token_pool.req_to_token[req.req_pool_idx]
        req.prefix_indices = row[: len(req.fill_ids)].to(torch.int64).clone()
        if req.queue_time is None:
            req.queue_time = time.monotonic() - req.arrival_time
        sched.tree_cache.cache_unfinished_req(req)
        req.check_finished()
        if req.finished():
            sched.tree_cache.cache_finished_req(req)
        else:
            sched.running_batch.merge_batch(ScheduleBatch([req], sched.kv))
        return [req]

    # ---- endings ------------------------------------------------------------------------------

    def _end(self, room: DecodeRoom, reason: FinishReason) -> list[Req]:
        """End the request now. Pages the prefill may still write stay held (DRAIN)."""
        req = room.req
        req.finished_reason = reason
        if room.stage is Stage.TRANSFER:
            self.kv.send(room.endpoint, KVAbort(_room(req), self.kv.endpoint))
            room.stage, room.since = Stage.DRAIN, None
            return [req]
        if room.endpoint and room.stage is Stage.PREALLOC:
            self.kv.send(room.endpoint, KVAbort(_room(req), self.kv.endpoint))
        self._free(room)
        return [req]

    def _free(self, room: DecodeRoom) -> None:
        self.rooms.pop(_room(room.req), None)
        if room.holds_kv:
            room.holds_kv = False
            self.scheduler.tree_cache.cache_finished_req(room.req, is_insert=False)

    def _sweep(self, now: float, dead: set[str], restarted: set[str]) -> list[Req]:
        done: list[Req] = []
        for room in list(self.rooms.values()):
            if room.since is None:
                room.since = now
            age = now - room.since
            if room.address in restarted and room.stage is not Stage.RESOLVE:
                self._rebind(room)
            elif room.address in dead and room.stage is not Stage.RESOLVE:
                # a dead prefill writes nothing more: its rooms' pages are free at once
                if room.stage is not Stage.DRAIN:
                    self.stats.transfer_failed += 1
                    why = f"prefill {room.address} stopped answering its bootstrap server"
                    room.req.finished_reason = FinishAbort(why, 500)
                    done.append(room.req)
                self._free(room)
            elif room.stage is Stage.TRANSFER and age > self.config.waiting_timeout_s:
                self.stats.transfer_failed += 1
                why = f"KV transfer from prefill {room.address} timed out after {age:.0f} s"
                done += self._end(room, FinishAbort(why, 500))
            elif room.stage is Stage.DRAIN and age > self.config.abort_drain_s:
                logger.warning("room %d: no drain answer from %s", _room(room.req), room.address)
                self._free(room)
        return done

    def abort(self, hit: set[str] | None, reason: FinishReason) -> list[Req]:
        done: list[Req] = []
        for room in list(self.rooms.values()):
            if room.stage is Stage.DRAIN or (hit is not None and room.req.rid not in hit):
                continue
            done += self._end(room, reason)
        return done

    def load_fields(self) -> dict[str, int | float]:
        stages = [r.stage for r in self.rooms.values()]
        return {
            "num_decode_prealloc_queue_reqs": sum(
                s in (Stage.RESOLVE, Stage.PREALLOC) for s in stages
            ),
            "num_decode_transfer_queue_reqs": stages.count(Stage.TRANSFER),
            **self.stats.load_fields(),
        }

    def close(self) -> None:
        self.directory.close()
        self.kv.close()


def _room(req: Req) -> int:
    assert req.bootstrap is not None
    return req.bootstrap.room
