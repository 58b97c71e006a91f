"""One rank's side of the KV transfer: its registered KV buffers, its control sockets and (on a
prefill) the thread that writes pages into a decode's buffers.

Control messages (`wire`) go over ZMQ: each rank binds one PULL socket and keeps a PUSH socket
per peer endpoint. Every socket is used from the scheduler thread only; the transfer thread
touches nothing but the backend and two queues. Pages move at page granularity: runs of
consecutive pages on both sides become one (source, destination, length) entry per layer and
K/V, and a request's whole transfer is one blocking batch of the backend.
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
from radixserve.engine.disaggregation.wire import ToDecode, ToPrefill

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class KVLayout:
    """Where one rank's KV lives: per-layer K and V base addresses, the bytes of one token's
    K (or V) in one layer, tokens per page, and each buffer's length in bytes."""

    k_ptrs: tuple[int, ...]
    v_ptrs: tuple[int, ...]
    item_len: int
    page_size: int
    buffer_len: int

    @property
    def page_bytes(self) -> int:
        """One page of one layer's K (or V)."""
        return self.item_len * self.page_size

    @property
    def bytes_per_page(self) -> int:
        """One page across every layer, K and V: what a transferred page costs."""
        return 2 * len(self.k_ptrs) * self.page_bytes

    def regions(self) -> list[tuple[int, int]]:
        return [(p, self.buffer_len) for p in (*self.k_ptrs, *self.v_ptrs)]


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
class TransferJob:
    room: int
    session: str
    src_pages: list[int]
    dst_pages: list[int]
    dst_k_ptrs: list[int]
    dst_v_ptrs: list[int]


@dataclass(frozen=True, slots=True)
class TransferResult:
    room: int
    rc: int
    num_pages: int
    num_bytes: int
    seconds: float


def batch_for(job: TransferJob, layout: KVLayout) -> tuple[list[int], list[int], list[int]]:
    """The backend's (src, dst, length) lists for a job: every run, every layer, K and V."""
    src: list[int] = []
    dst: list[int] = []
    lens: list[int] = []
    pb = layout.page_bytes
    runs = page_runs(job.src_pages, job.dst_pages)
    local = (*layout.k_ptrs, *layout.v_ptrs)
    remote = (*job.dst_k_ptrs, *job.dst_v_ptrs)
    for base, peer in zip(local, remote, strict=True):
        for s, d, n in runs:
            src.append(base + s * pb)
            dst.append(peer + d * pb)
            lens.append(n * pb)
    return src, dst, lens


class KVManager:
    def __init__(
        self, backend: TransferBackend, layout: KVLayout, host: str, ctx: zmq.Context[Any]
    ) -> None:
        self.backend = backend
        self.layout = layout
        backend.register(layout.regions())
        self._ctx = ctx
        self._pull = ctx.socket(zmq.PULL)
        port = self._pull.bind_to_random_port(f"tcp://{host}")
        self.endpoint = f"tcp://{host}:{port}"
        self._push: dict[str, zmq.Socket[Any]] = {}
        self._encoder = msgspec.msgpack.Encoder()
        self._jobs: queue.Queue[TransferJob | None] = queue.Queue()
        self._done: queue.Queue[TransferResult] = queue.Queue()
        self._thread: threading.Thread | None = None

    # ---- control plane (scheduler thread) ----------------------------------------------------

    def send(self, endpoint: str, msg: msgspec.Struct) -> None:
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

    def recv(self, msg_type: Any) -> list[Any]:
        """Every message waiting on the PULL socket, decoded as `msg_type` (a union)."""
        decoder = msgspec.msgpack.Decoder(msg_type)
        out: list[Any] = []
        while True:
            try:
                raw = self._pull.recv(zmq.NOBLOCK)
            except zmq.Again:
                return out
            try:
                out.append(decoder.decode(raw))
            except msgspec.DecodeError:
                logger.warning("disaggregation: undecodable control message dropped")

    def recv_to_prefill(self) -> list[ToPrefill]:
        return self.recv(ToPrefill)

    def recv_to_decode(self) -> list[ToDecode]:
        return self.recv(ToDecode)

    # ---- data plane (prefill) ------------------------------------------------------------------

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
            src, dst, lens = batch_for(job, self.layout)
            try:
                rc = self.backend.write(job.session, src, dst, lens)
            except Exception:  # a backend error fails this room, never the thread
                logger.exception("disaggregation: transfer of room %d failed", job.room)
                rc = -1
            self._done.put(
                TransferResult(
                    job.room,
                    rc,
                    len(job.src_pages),
                    len(job.src_pages) * self.layout.bytes_per_page,
                    time.perf_counter() - started,
                )
            )

    def close(self) -> None:
        if self._thread is not None:
            self._jobs.put(None)
            self._thread.join(timeout=5)
        for sock in self._push.values():
            sock.close(0)
        self._pull.close(0)
        self.backend.close()
