"""The prefill side of a prefill/decode pair: its queues around the ordinary scheduler.

A request that names a decode (`req.bootstrap`) lives in a room, keyed by its bootstrap_room:
1. bootstrap queue: waits for the decode's `KVRequest` (which pages to write, and how much of
   the prompt the decode already holds); a topology mismatch is refused here, on both sides;
2. the scheduler's own waiting queue and prefill batches (chunked, cache hits as usual), with
   max_new_tokens = 1;
3. inflight queue: once the prompt is computed, its KV goes into this side's radix cache (locked)
   and the pages the decode lacks are written by the transfer thread; then `KVDone` carries the
   first token;
4. on the decode's `KVAck` the lock is dropped (the KV stays cached here for reuse) and the
   request finishes, so its HTTP response goes out only then.
Aborts and failures in every queue tell the decode (`KVFailed`) and never free pages a write
is still reading. Messages for rooms this side has not seen yet are kept until their request
arrives (the router sends to both sides at once).

Under TP every rank writes its own KV heads into the decode's ranks (re-sliced when the TP
sizes differ); rank 0 alone sends and receives the control messages, and each round's inputs
are agreed by all ranks (`disagg_sync`), so they keep the same rooms in the same stages.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from enum import Enum, auto
from typing import TYPE_CHECKING

from radixserve.engine.disaggregation.bootstrap import BootstrapServer
from radixserve.engine.disaggregation.kv_manager import (
    KVManager,
    TransferJob,
    TransferResult,
    plan_targets,
)
from radixserve.engine.disaggregation.wire import (
    KVAbort,
    KVAck,
    KVDone,
    KVDrained,
    KVFailed,
    KVRefuse,
    KVRequest,
    Topology,
    ToPrefill,
    topology_mismatch,
)
from radixserve.engine.ipc.finish_reason import FinishAbort, FinishReason
from radixserve.engine.scheduler.disagg_common import DisaggConfig, DisaggStats, Tombstones
from radixserve.engine.scheduler.disagg_sync import Completions, RankRound, RoundSync, decode_msgs
from radixserve.engine.scheduler.req import Req

if TYPE_CHECKING:
    from radixserve.engine.scheduler.scheduler import Scheduler

logger = logging.getLogger(__name__)


class Stage(Enum):
    BOOTSTRAP = auto()  # waiting for the decode's KVRequest
    PREFILL = auto()  # in the scheduler's queue or batches
    TRANSFER = auto()  # pages being written
    SENT = auto()  # KVDone sent, waiting for the ack


@dataclass(eq=False, slots=True)
class PrefillRoom:
    req: Req
    since: float | None = None  # when its stage began (None: from the next round's clock)
    stage: Stage = Stage.BOOTSTRAP
    request: KVRequest | None = None
    drain_to: str | None = None  # the decode aborted mid-transfer: answer it when drained
    end: FinishReason | None = None  # how the request ends once its KV is released
    transfer: TransferResult | None = None
    pages: list[int] = field(default_factory=list)


class PrefillDisagg:
    def __init__(
        self,
        scheduler: Scheduler,
        kv: KVManager,
        topology: Topology,
        address: str,
        config: DisaggConfig,
        sync: RoundSync,
        server: BootstrapServer | None = None,
    ) -> None:
        self.scheduler = scheduler
        self.server = server  # the bootstrap server this rank hosts (rank 0)
        self.kv = kv
        self.sync = sync
        self.heads = [r.heads for r in sync.ranks]  # every rank's KV heads, rank order
        self.completions = Completions(len(self.heads))
        self.now = 0.0  # rank 0's clock at the last round: every rank times rooms by it
        self.topology = topology
        self.address = address  # this prefill's bootstrap host:port, for error messages
        self.config = config
        self.rooms: dict[int, PrefillRoom] = {}
        self.early: dict[int, tuple[ToPrefill, float]] = {}  # messages ahead of their request
        self.closed = Tombstones(config.bootstrap_timeout_s)  # rooms ended here: answer late asks
        self.stats = DisaggStats()

    # ---- admission ------------------------------------------------------------------------

    def add(self, req: Req) -> None:
        assert req.bootstrap is not None
        room = req.bootstrap.room
        if room in self.rooms:
            req.finished_reason = FinishAbort(
                f"bootstrap_room: room {room} is already in use on this prefill server", 400
            )
            return
        req.sampling_params.max_new_tokens = 1  # the decode generates the rest
        self.rooms[room] = PrefillRoom(req)
        early = self.early.pop(room, None)
        if early is not None:
            self._dispatch(early[0])

    def pending(self) -> bool:
        return bool(self.rooms)

    # ---- the step hook ------------------------------------------------------------------------

    def poll(self) -> list[Req]:
        """Progress every room; returns the requests that finished here."""
        lead = self.sync.lead
        mine = RankRound(
            time.monotonic() if lead else 0.0,
            self.kv.recv_raw() if lead else [],
            self.kv.poll_done(),
        )
        rounds = self.sync.exchange(mine)
        self.now = rounds[0].now
        done: list[Req] = []
        for msg in decode_msgs(rounds[0].msgs, ToPrefill):
            done += self._dispatch(msg)
        for result in self.completions.add(rounds):
            done += self._on_transferred(result)
        done += self._sweep(self.now)
        return done

    def _dispatch(self, msg: ToPrefill) -> list[Req]:
        room = self.rooms.get(msg.room)
        if room is None:
            return self._unknown_room(msg)
        if isinstance(msg, KVRequest):
            return self._on_request(room, msg)
        if isinstance(msg, KVAck):
            return self._on_ack(room)
        if isinstance(msg, KVRefuse):
            self.stats.bootstrap_failed += 1
            return self._end_early(room, FinishAbort(msg.reason, 500), tell_decode=False)
        return self._on_abort(room, msg)

    def _unknown_room(self, msg: ToPrefill) -> list[Req]:
        """A room ended here, or whose request has not arrived yet."""
        reason = self.closed.get(msg.room)
        if isinstance(msg, KVAbort):
            self.early.pop(msg.room, None)
            self.kv.send(msg.decode_endpoint, KVDrained(msg.room))  # nothing in flight here
            self.closed.add(msg.room, "the decode server aborted the request", self.now)
        elif isinstance(msg, KVRequest) and reason is not None:
            self.kv.send(msg.decode_endpoint, KVFailed(msg.room, reason))
        elif reason is None and isinstance(msg, KVRequest | KVRefuse):
            self.early[msg.room] = (msg, self.now)
        return []

    def _on_request(self, room: PrefillRoom, msg: KVRequest) -> list[Req]:
        if room.stage is not Stage.BOOTSTRAP:
            return []  # a duplicate
        room.request = msg
        problem = topology_mismatch(self.topology, msg.topology, self.address, msg.decode_endpoint)
        if problem is None:
            problem = self._check_pages(room.req, msg)
        if problem is not None:
            self.stats.bootstrap_failed += 1
            logger.warning("room %d refused: %s", msg.room, problem)
            return self._end_early(room, FinishAbort(problem, 500), tell_decode=True)
        room.stage = Stage.PREFILL
        self.scheduler.waiting_queue.append(room.req)
        return []

    def _check_pages(self, req: Req, msg: KVRequest) -> str | None:
        ps, n = self.topology.page_size, len(req.origin_input_ids)
        start = msg.decode_prefix_len
        if start % ps or not 0 <= start <= n:
            return f"decode_prefix_len {start} is not a page boundary within the prompt ({n})"
        want = -(-n // ps) - start // ps
        layers = {len(r.k_ptrs) for r in msg.dst_ranks} | {len(r.v_ptrs) for r in msg.dst_ranks}
        if not msg.dst_ranks or layers != {self.topology.num_layers}:
            want_layers = self.topology.num_layers
            return f"the decode sent KV buffers for {sorted(layers)} layers, not {want_layers}"
        if len(msg.dst_pages) != want:
            return (
                f"the decode sent {len(msg.dst_pages)} pages for a prompt of {n} tokens from "
                f"{start} (page size {ps}: {want} expected)"
            )
        return None

    def _on_abort(self, room: PrefillRoom, msg: KVAbort) -> list[Req]:
        reason = FinishAbort("the decode server aborted the request", 500)
        if room.stage is Stage.TRANSFER:  # answer once the write has returned
            room.drain_to, room.end = msg.decode_endpoint, reason
            return []
        self.kv.send(msg.decode_endpoint, KVDrained(msg.room))
        if room.stage is Stage.SENT:
            room.end = reason
            return self._release(room)
        return self._end_early(room, reason, tell_decode=False)

    def _end_early(self, room: PrefillRoom, reason: FinishAbort, tell_decode: bool) -> list[Req]:
        """End a room before its KV was computed (bootstrap or prefill stage)."""
        req = room.req
        self._close(req, reason.message)
        if tell_decode and room.request is not None:
            self.kv.send(room.request.decode_endpoint, KVFailed(req_room(req), reason.message))
        if room.stage is Stage.BOOTSTRAP:
            req.finished_reason = reason
            return [req]
        # in the scheduler's queue or batches: its abort path frees what it holds
        return self.scheduler.abort_request(req.rid, reason=reason)

    def _close(self, req: Req, why: str) -> None:
        room = req_room(req)
        self.rooms.pop(room, None)
        self.closed.add(room, why, self.now)

    # ---- after the prefill --------------------------------------------------------------------

    def on_prefilled(self, req: Req) -> bool:
        """Called for a finished request after its prefill. True when this side now holds it
        (its KV is on its way to the decode); False for a request without a room."""
        room = self.rooms.get(req_room(req)) if req.bootstrap is not None else None
        if room is None or room.request is None:
            return False
        msg = room.request
        cache = self.scheduler.tree_cache
        cache.cache_unfinished_req(req)  # prompt KV into the radix tree, locked for the send
        ps = self.topology.page_size
        assert req.req_pool_idx is not None
        n = len(req.origin_input_ids)
        row = self.scheduler.kv.req_to_token_pool.req_to_token[req.req_pool_idx]
        slots = row[msg.decode_prefix_len : n : ps].tolist()
        room.pages = [int(s) // ps for s in slots]
        room.stage, room.since = Stage.TRANSFER, None
        rank = self.sync.cpu.rank
        targets = plan_targets(rank, self.heads, msg.dst_ranks, self.kv.layout.head_bytes)
        self.kv.submit(TransferJob(msg.room, room.pages, msg.dst_pages, targets))
        return True

    def _on_transferred(self, result: TransferResult) -> list[Req]:
        room = self.rooms.get(result.room)
        if room is None:
            return []
        req, msg = room.req, room.request
        assert msg is not None
        room.transfer = result
        if room.drain_to is not None:
            self.kv.send(room.drain_to, KVDrained(result.room))
            return self._release(room)
        if result.rc != 0:
            self.stats.transfer_failed += 1
            why = f"KV transfer to decode {msg.decode_endpoint} failed (engine rc {result.rc})"
            self.kv.send(msg.decode_endpoint, KVFailed(result.room, why))
            room.end = FinishAbort(why, 500)
            return self._release(room)
        self.stats.count_transfer(result.num_pages, result.num_bytes, result.seconds)
        top = req.output_top_logprobs[0] if req.output_top_logprobs else []
        logprob = req.output_token_logprobs[0] if req.output_token_logprobs else 0.0
        done = KVDone(
            result.room, req.output_ids[0], logprob, top, req.cached_tokens,
            result.num_pages, result.num_bytes,
            req.input_token_logprobs, req.input_top_logprobs,
        )  # fmt: skip
        self.kv.send(msg.decode_endpoint, done)
        room.stage, room.since = Stage.SENT, None
        return []

    def _on_ack(self, room: PrefillRoom) -> list[Req]:
        if room.stage is not Stage.SENT:
            return []
        return self._release(room)

    def _release(self, room: PrefillRoom) -> list[Req]:
        """The transfer is over: unlock the prompt's KV (it stays cached) and finish."""
        req = room.req
        self._close(req, "the request already ended on the prefill server")
        if room.end is not None:
            req.finished_reason = room.end
        self.scheduler.tree_cache.cache_finished_req(req)
        return [req]

    # ---- timeouts and aborts ------------------------------------------------------------------

    def _sweep(self, now: float) -> list[Req]:
        done: list[Req] = []
        for key, (_, since) in list(self.early.items()):
            if now - since > self.config.bootstrap_timeout_s:
                del self.early[key]
        self.closed.expire(now)
        for room in list(self.rooms.values()):
            done += self._check_room(room, now)
        return done

    def _check_room(self, room: PrefillRoom, now: float) -> list[Req]:
        if room.since is None:
            room.since = now
        req, age = room.req, now - room.since
        if room.stage is Stage.BOOTSTRAP and age > self.config.bootstrap_timeout_s:
            self.stats.bootstrap_failed += 1
            why = f"no decode server asked for bootstrap_room {req_room(req)} within {age:.0f} s"
            return self._end_early(room, FinishAbort(why, 500), tell_decode=False)
        if room.stage is Stage.PREFILL and isinstance(req.finished_reason, FinishAbort):
            # aborted in the scheduler's queue or batches: it freed the KV; tell the decode
            self._close(req, req.finished_reason.message)
            if room.request is not None:
                failed = KVFailed(req_room(req), req.finished_reason.message)
                self.kv.send(room.request.decode_endpoint, failed)
            return []
        if room.stage is Stage.SENT and age > self.config.waiting_timeout_s:
            room.end = FinishAbort(f"the decode server did not acknowledge in {age:.0f} s", 500)
            return self._release(room)
        return []

    def abort(self, hit: set[str] | None, reason: FinishReason) -> list[Req]:
        """Scheduler.abort_request for requests it does not hold: those in the bootstrap queue
        end now; those being transferred end when the transfer concludes."""
        done: list[Req] = []
        for room in list(self.rooms.values()):
            if hit is not None and room.req.rid not in hit:
                continue
            if room.stage is Stage.BOOTSTRAP:
                abort = reason if isinstance(reason, FinishAbort) else FinishAbort()
                done += self._end_early(room, abort, tell_decode=False)
            elif room.stage in (Stage.TRANSFER, Stage.SENT):
                room.end = reason
        return done

    def load_fields(self) -> dict[str, int | float]:
        queued = sum(r.stage is Stage.BOOTSTRAP for r in self.rooms.values())
        inflight = sum(r.stage in (Stage.TRANSFER, Stage.SENT) for r in self.rooms.values())
        return {
            "num_prefill_bootstrap_queue_reqs": queued,
            "num_prefill_inflight_queue_reqs": inflight,
            **self.stats.load_fields(),
        }

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
        self.kv.close()


def req_room(req: Req) -> int:
    assert req.bootstrap is not None
    return req.bootstrap.room
