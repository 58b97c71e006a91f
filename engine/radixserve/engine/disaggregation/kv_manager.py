"""One rank's side of the KV transfer: its registered KV buffers, its control sockets (TP rank
0 only: it speaks for its peers) and, on a prefill, the thread that writes pages into the
decode's buffers.

Control messages (`wire`) go over ZMQ: the control rank binds one PULL socket and keeps a PUSH
socket per peer endpoint. Every socket is used from the scheduler thread only; the transfer
thread touches nothing but the backend and two queues. Every prefill rank writes its own heads
(`plan_targets`). Where a decode rank's rows are exactly ours (the same heads), pages move
whole: runs of consecutive pages on both sides become one (source, destination, length) entry
per layer and K/V. Where the TP sizes differ, each token's row is re-sliced: one entry per
token, layer and K/V. A request's transfer is one blocking batch of the backend per decode rank.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass
from typing import Any

import msgspec
import zmq

from radixserve.engine.disaggregation.transfer import TransferBackend
from radixserve.engine.disaggregation.wire import KVHeads, RankKV

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class KVLayout:
    """Where one rank's KV lives: per-layer K and V base addresses, the bytes of one token's
    K (or V) row in one layer, tokens per page, each buffer's length in bytes, and the KV heads
    a row holds."""

    k_ptrs: tuple[int, ...]
    v_ptrs: tuple[int, ...]
    item_len: int
    page_size: int
    buffer_len: int
    heads: KVHeads = KVHeads(0, 1)

    @property
    def page_bytes(self) -> int:
        """One page of one layer's K (or V)."""
        return self.item_len * self.page_size

    @property
    def head_bytes(self) -> int:
        return self.item_len // self.heads.count

    def regions(self) -> list[tuple[int, int]]:
        return [(p, self.buffer_len) for p in (*self.k_ptrs, *self.v_ptrs)]

    def rank_kv(self, session: str) -> RankKV:
        return RankKV(session, self.heads, list(self.k_ptrs), list(self.v_ptrs), self.item_len)


def page_runs(src: list[int], dst: list[int]) -> list[tuple[int, int, int]]:
    """(first src page, first dst page, count) for each run consecutive on both sides."""
    runs: list[tuple[int, int, int]] = []
    for s, d in zip(src, dst, strict=True):
        if runs and runs[-1][0] + runs[-1][2] == s and runs[-1][1] + runs[-1][2] == d:
            a, b, n = runs[-1]
            runs[-1] = (a, b, n + 1)
        else:
            runs.append((s, d, 1))
    return runs


@dataclass(frozen=True, slots=True)
class Target:
    """What one prefill rank writes into one decode rank: of every token's row, `length` bytes
    from `src_offset` in its own row to `dst_offset` in the decode's (`dst.item_len` long)."""

    dst: RankKV
    src_offset: int
    dst_offset: int
    length: int


def plan_targets(
    rank: int, prefill: list[KVHeads], decode: list[RankKV], head_bytes: int
) -> list[Target]:
    """The writes prefill rank `rank` owes: each decode rank's heads, each written by the first
    prefill rank that holds it (replicated heads are written once). Heads are contiguous on
    every rank, so a decode rank gets at most one slice from each prefill rank."""
    mine = prefill[rank]
    out: list[Target] = []
    for dst in decode:
        ours = [
            h
            for h in range(dst.heads.first, dst.heads.first + dst.heads.count)
            if next(r for r, held in enumerate(prefill) if h in held) == rank
        ]
        if ours:
            out.append(
                Target(
                    dst,
                    (ours[0] - mine.first) * head_bytes,
                    (ours[0] - dst.heads.first) * head_bytes,
                    len(ours) * head_bytes,
                )
            )
    return out


@dataclass(frozen=True, slots=True)
class TransferJob:
    room: int
    src_pages: list[int]
    dst_pages: list[int]
    targets: list[Target]


@dataclass(frozen=True, slots=True)
class TransferResult:
    room: int
    rc: int
    num_pages: int
    num_bytes: int
    seconds: float


Batch = tuple[str, list[int], list[int], list[int]]  # session, src, dst, lengths


def batches_for(job: TransferJob, layout: KVLayout) -> list[Batch]:
    """The backend's (session, src, dst, length) batches for a job, one per target: whole
    page runs where the target takes our whole rows, else a slice of every token's row."""
    runs = page_runs(job.src_pages, job.dst_pages)
    local = (*layout.k_ptrs, *layout.v_ptrs)
    out: list[Batch] = []
    for t in job.targets:
        whole = t.src_offset == t.dst_offset == 0 and t.length == layout.item_len == t.dst.item_len
        src: list[int] = []
        dst: list[int] = []
        lens: list[int] = []
        remote = (*t.dst.k_ptrs, *t.dst.v_ptrs)
        for base, peer in zip(local, remote, strict=True):
            for s, d, n in runs:
                if whole:
                    src.append(base + s * layout.page_bytes)
                    dst.append(peer + d * layout.page_bytes)
                    lens.append(n * layout.page_bytes)
                    continue
                first_s, first_d = s * layout.page_size, d * layout.page_size
                for i in range(n * layout.page_size):
                    src.append(base + (first_s + i) * layout.item_len + t.src_offset)
                    dst.append(peer + (first_d + i) * t.dst.item_len + t.dst_offset)
                    lens.append(t.length)
        out.append((t.dst.session, src, dst, lens))
    return out


class KVManager:
    def __init__(
        self,
        backend: TransferBackend,
        layout: KVLayout,
        host: str,
        ctx: zmq.Context[Any],
        control: bool = True,
    ) -> None:
        self.backend = backend
        self.layout = layout
        backend.register(layout.regions())
        self._ctx = ctx
        self._pull: zmq.Socket[Any] | None = None
        self.endpoint = ""  # a TP peer's: it has no control socket
        if control:
            self._pull = ctx.socket(zmq.PULL)
            port = self._pull.bind_to_random_port(f"tcp://{host}")
            self.endpoint = f"tcp://{host}:{port}"
        self._push: dict[str, zmq.Socket[Any]] = {}
        self._encoder = msgspec.msgpack.Encoder()
        self._jobs: queue.Queue[TransferJob | None] = queue.Queue()
        self._done: queue.Queue[TransferResult] = queue.Queue()
        self._thread: threading.Thread | None = None

    # ---- control plane (scheduler thread, control rank) --------------------------------------

    def send(self, endpoint: str, msg: msgspec.Struct) -> None:
        """Send a control message; a TP peer sends nothing (its rank 0 sends the same)."""
        if self._pull is None:
            return
        sock = self._push.get(endpoint)
        if sock is None:
            sock = self._ctx.socket(zmq.PUSH)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.SNDHWM, 10000)
            sock.connect(endpoint)
            self._push[endpoint] = sock
        try:
            sock.send(self._encoder.encode(msg), zmq.NOBLOCK)
        except zmq.Again:  # a peer that is gone and whose queue is full: its rooms time out
            logger.warning("disaggregation: dropped a %s to %s", type(msg).__name__, endpoint)

    def recv_raw(self) -> list[bytes]:
        """Every message waiting on the PULL socket, undecoded (none on a TP peer)."""
        out: list[bytes] = []
        while self._pull is not None:
            try:
                out.append(self._pull.recv(zmq.NOBLOCK))
            except zmq.Again:
                break
        return out

    # ---- data plane (prefill, every rank) ------------------------------------------------------

    def submit(self, job: TransferJob) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._work, name="pd-transfer", daemon=True)
            self._thread.start()
        self._jobs.put(job)

    def poll_done(self) -> list[TransferResult]:
        out: list[TransferResult] = []
        while True:
            try:
                out.append(self._done.get_nowait())
            except queue.Empty:
                return out

    def _work(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            started = time.perf_counter()
            rc, moved = 0, 0
            for session, src, dst, lens in batches_for(job, self.layout):
                try:
                    rc = self.backend.write(session, src, dst, lens)
                except Exception:  # a backend error fails this room, never the thread
                    logger.exception("disaggregation: transfer of room %d failed", job.room)
                    rc = -1
                if rc != 0:
                    break
                moved += sum(lens)
            seconds = time.perf_counter() - started
            self._done.put(TransferResult(job.room, rc, len(job.src_pages), moved, seconds))

    def close(self) -> None:
        if self._thread is not None:
            self._jobs.put(None)
            self._thread.join(timeout=5)
        for sock in self._push.values():
            sock.close(0)
        if self._pull is not None:
            self._pull.close(0)
        self.backend.close()
