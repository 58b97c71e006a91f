"""Storage prefetch (`--hicache-storage-prefetch-policy`): the pages a waiting request will find
in the storage tier are read on a background thread while the engine computes other batches,
so admission only copies bytes that are already in memory.

A prefetch starts when the scheduler first sees the request waiting: the tree says where its
cached prefix ends (in any tier), and the pages after it are looked up by chain hash. The
reader asks the backend how many leading pages it holds, declines a hit shorter than
`prefetch_threshold` tokens (a short recompute is cheaper), then reads page by page. At
admission the policy says whether the request may go with what has landed so far:
- `best_effort`: always; the pages not read yet are recomputed;
- `wait_complete`: only when the read finished; until then the request is skipped this round
  (it stays queued; the requests behind it are still scheduled);
- `timeout` (SGLang's default): when finished, or once `prefetch_timeout_base +
  prefetch_timeout_per_ki_token × tokens / 1024` seconds passed since the first round that
  found it unfinished.

Staged pages are bounded: a read stops when the pages staged for waiting requests would pass
`max_staged_bytes` (half the host pool, as SGLang limits prefetch to half of it); the rest of
that request is recomputed. A backend that fails (a lost store, a full disk) ends the read at
that page, with a warning: the request recomputes, nothing else is affected.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass, field

from radixserve.engine.mem_cache.hicache_storage import HiCacheStorage

logger = logging.getLogger(__name__)

PREFETCH_POLICIES = ("best_effort", "wait_complete", "timeout")
NOT_YET = -1  # a rank's answer while its policy says the request must wait


@dataclass(frozen=True, slots=True)
class PrefetchConfig:
    policy: str = "timeout"
    threshold: int = 256  # tokens: a storage hit shorter than this is recomputed
    timeout_base: float = 1.0  # seconds
    timeout_per_ki_token: float = 0.25  # seconds per 1,024 tokens to read


@dataclass(eq=False, slots=True)
class PrefetchOp:
    """One waiting request's read: the pages after `start` tokens of its key, in order."""

    start: int
    digests: list[bytes]
    pages: list[bytes] = field(default_factory=list)  # landed so far (the reader appends)
    done: threading.Event = field(default_factory=threading.Event)
    cancelled: bool = False
    blocked_since: float | None = None  # the first admission round that found it unfinished
    retry: int = 0  # how many reads of this request came before (the tree lost their prefix)


class StoragePrefetcher:
    """The reader thread and its bound on staged bytes; the scheduler thread submits, polls
    and finishes operations."""

    def __init__(
        self,
        storage: HiCacheStorage,
        config: PrefetchConfig,
        page_tokens: int,
        page_bytes: int,
        max_staged_bytes: int,
    ) -> None:
        if config.policy not in PREFETCH_POLICIES:
            raise ValueError(f"hicache_storage_prefetch_policy: unknown {config.policy!r}")
        self.storage = storage
        self.config = config
        self.page_tokens = page_tokens
        self.page_bytes = page_bytes
        self.max_staged_bytes = max_staged_bytes
        self._lock = threading.Lock()  # guards op.pages/op.cancelled and _staged
        self._staged = 0
        self._queue: queue.Queue[PrefetchOp | None] = queue.Queue()
        self._reader = threading.Thread(
            target=self._read_loop, name="hicache-prefetch", daemon=True
        )
        self._reader.start()

    def submit(self, start: int, digests: list[bytes], retry: int = 0) -> PrefetchOp:
        op = PrefetchOp(start, digests, retry=retry)
        self._queue.put(op)
        return op

    def ready_pages(self, op: PrefetchOp, now: float) -> int:
        """How many pages the request may go with now, or NOT_YET while the policy says wait."""
        if op.done.is_set() or self.config.policy == "best_effort":
            return len(op.pages)
        if self.config.policy == "wait_complete":
            return NOT_YET
        if op.blocked_since is None:
            op.blocked_since = now
        tokens = len(op.digests) * self.page_tokens
        limit = self.config.timeout_base + self.config.timeout_per_ki_token * tokens / 1024
        return len(op.pages) if now - op.blocked_since >= limit else NOT_YET

    def finish(self, op: PrefetchOp, n: int) -> list[bytes]:
        """Stop `op` and hand over its first `n` pages; the rest are dropped."""
        with self._lock:
            op.cancelled = True
            self._staged -= len(op.pages) * self.page_bytes
            return op.pages[:n]

    def staged_bytes(self) -> int:
        with self._lock:
            return self._staged

    def pending(self) -> int:
        return self._queue.qsize()

    def close(self) -> None:
        self._queue.put(None)
        self._reader.join(timeout=10)

    # ---- reader thread ----------------------------------------------------------------------

    def _read_loop(self) -> None:
        while True:
            op = self._queue.get()
            if op is None:
                return
            start = time.perf_counter()
            try:
                self._read(op)
            except Exception as exc:  # noqa: BLE001 - a failing backend costs a recompute only
                logger.warning("hicache prefetch: storage read failed: %s", exc)
            finally:
                op.done.set()
            logger.debug(
                "hicache prefetch: %d/%d pages in %.1f ms",
                len(op.pages),
                len(op.digests),
                1e3 * (time.perf_counter() - start),
            )

    def _read(self, op: PrefetchOp) -> None:
        if op.cancelled:
            return
        found = self.storage.batch_exists(op.digests)
        if found * self.page_tokens < max(self.config.threshold, 1):
            return
        for digest in op.digests[:found]:
            with self._lock:
                if op.cancelled or self._staged + self.page_bytes > self.max_staged_bytes:
                    return
            payload = self.storage.get(digest)
            if payload is None or len(payload) != self.page_bytes:
                return  # missing (evicted since) or corrupt: recomputed from here on
            with self._lock:
                if op.cancelled:
                    return
                op.pages.append(payload)
                self._staged += self.page_bytes
