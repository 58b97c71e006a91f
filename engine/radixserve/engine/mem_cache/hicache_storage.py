"""HiCache's storage tier (L3): KV pages keyed by their chain hash, shared by every replica
that serves the same model and points at the same place.

A key is one page's chained SHA-256 (the digest the KV events carry, so a key names the whole
prefix up to and including that page) plus the model and the rank layout, since each TP rank
stores only its own heads: `{digest}_{model}_{tp_rank}_{tp_size}`.

`HiCacheFile` keeps one file per page: a header (magic, payload length, SHA-256 of the
payload), then the payload. Files are written to a temporary name and renamed, so a reader
never sees half a page; a page whose length or checksum does not match is deleted and reported
missing, so the caller recomputes it. Writes go through one background thread (the scheduler
only queues them); reads go through the prefetch thread (hicache_prefetch.py). Capacity is
bounded: past it, the least recently used files (by this process's use, then by mtime for
files other replicas wrote) are deleted down to 90 % of it.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import queue
import threading
import time
import uuid
from abc import ABC, abstractmethod
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger(__name__)

MAGIC = b"RXKV0001"
HEADER_BYTES = len(MAGIC) + 8 + 32
EVICT_TO = 0.9  # after crossing the capacity, delete down to this fraction of it


@dataclass(frozen=True, slots=True)
class StorageConfig:
    path: Path
    capacity_bytes: int
    model_tag: str  # the served model: pages of different models never share a key
    tp_rank: int = 0
    tp_size: int = 1


class HiCacheStorage(ABC):
    medium = "DISK"  # what KV events call this tier (SGLang's StorageMedium names)

    @abstractmethod
    def get(self, digest: bytes) -> bytes | None:
        """The page stored under `digest`, or None when it is missing or corrupt."""

    @abstractmethod
    def exists(self, digest: bytes) -> bool: ...

    _queue: queue.Queue[tuple[bytes, bytes] | None]
    _writer: threading.Thread

    def _start_writer(self, name: str) -> None:
        """The one thread that writes: the scheduler only queues."""
        self._removed: queue.SimpleQueue[bytes] = queue.SimpleQueue()  # see take_removed
        self._queue = queue.Queue()
        self._writer = threading.Thread(target=self._write_loop, name=name, daemon=True)
        self._writer.start()

    @abstractmethod
    def _write(self, digest: bytes, payload: bytes) -> None:
        """Store one page, on the writer thread (skipped when the page is already stored)."""

    def set_async(self, digest: bytes, payload: bytes) -> None:
        """Queue a write."""
        self._queue.put((digest, payload))

    def pending_writes(self) -> int:
        return self._queue.qsize()

    def flush(self) -> None:
        """Wait until every queued write landed."""
        self._queue.join()

    def close(self) -> None:
        """Let the queued writes land (10 s at most), then release the backend."""
        self._queue.put(None)
        self._writer.join(timeout=10)
        self._close_backend()

    def _close_backend(self) -> None:  # noqa: B027 - a folder needs nothing
        """Release what the backend holds (a store client)."""

    def _write_loop(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is None:
                    return
                self._write(*item)
            except Exception as exc:  # noqa: BLE001 - a full disk, a lost store: not stored
                logger.warning("hicache storage: write failed: %s", exc)
            finally:
                self._queue.task_done()

    @abstractmethod
    def used_bytes(self) -> int: ...

    @abstractmethod
    def storage_id(self) -> str | None:
        """Names what this backend reads: equal for every replica and rank layout that can
        read each other's pages (routers group replicas by it); None: not mirrorable."""

    def take_removed(self) -> list[bytes]:
        """Digests of this model's pages deleted since the last call (capacity, corruption, a
        store's own eviction), whoever wrote them."""
        out = []
        while True:
            try:
                out.append(self._removed.get_nowait())
            except queue.Empty:
                return out

    def has(self, digest: bytes) -> bool:
        """`exists` for the scheduler thread: a backend that fails answers no (the page is
        queued again, and the writer skips what is stored), it never stops the scheduler."""
        try:
            return self.exists(digest)
        except Exception as exc:  # noqa: BLE001 - any backend error
            logger.warning("hicache storage: lookup failed: %s", exc)
            return False

    def batch_exists(self, digests: list[bytes]) -> int:
        """How many leading digests are stored."""
        n = 0
        for d in digests:
            if not self.exists(d):
                break
            n += 1
        return n


class HiCacheFile(HiCacheStorage):
    def __init__(self, config: StorageConfig) -> None:
        self.config = config
        self.root = config.path
        self.root.mkdir(parents=True, exist_ok=True)
        self._suffix = f"_{_safe(config.model_tag)}_{config.tp_rank}_{config.tp_size}.bin"
        self._lock = threading.Lock()  # guards _sizes/_total (writer thread and scheduler)
        self._sizes: OrderedDict[str, int] = OrderedDict()  # file name → bytes, LRU first
        self._total = 0
        self._rescan()
        self._start_writer("hicache-file")

    def name_of(self, digest: bytes) -> str:
        return digest.hex() + self._suffix

    def storage_id(self) -> str:
        """The folder's own id (made by the first process to open it) + model + layout."""
        id_file = self.root / ".storage-id"
        with contextlib.suppress(FileExistsError):
            fd = os.open(id_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
            with os.fdopen(fd, "w") as f:
                f.write(uuid.uuid4().hex)
        for _ in range(50):  # another process may be between its create and its write
            folder = id_file.read_text().strip()
            if folder:
                return f"file:{folder}{self._suffix.removesuffix('.bin')}"
            time.sleep(0.01)
        raise OSError(f"{id_file} stays empty")

    def exists(self, digest: bytes) -> bool:
        return (self.root / self.name_of(digest)).is_file()

    def get(self, digest: bytes) -> bytes | None:
        name = self.name_of(digest)
        try:
            raw = (self.root / name).read_bytes()
        except OSError:
            return None
        payload = _unpack(raw)
        if payload is None:
            logger.warning("hicache storage: %s is corrupt or truncated; recomputing it", name)
            self._delete(name)
            return None
        with self._lock:
            if name in self._sizes:
                self._sizes.move_to_end(name)
            else:  # another replica wrote it
                self._sizes[name] = len(raw)
                self._total += len(raw)
        return payload

    def used_bytes(self) -> int:
        with self._lock:
            return self._total

    # ---- writer thread ------------------------------------------------------------------------

    def _write(self, digest: bytes, payload: bytes) -> None:
        name = self.name_of(digest)
        final = self.root / name
        if final.is_file():
            return
        tmp = self.root / f".{name}.{os.getpid()}.{threading.get_ident()}.tmp"
        data = _pack(payload)
        tmp.write_bytes(data)
        os.replace(tmp, final)  # atomic: readers see the whole page or none
        with self._lock:
            self._sizes[name] = len(data)
            self._total += len(data)
            over = self._total > self.config.capacity_bytes
        if over:
            self._evict()

    def _evict(self) -> None:
        self._rescan()  # other replicas' files count against the shared capacity too
        target = int(self.config.capacity_bytes * EVICT_TO)
        while True:
            with self._lock:
                if self._total <= target or not self._sizes:
                    return
                name = next(iter(self._sizes))
            self._delete(name)

    def _delete(self, name: str) -> None:
        with contextlib.suppress(OSError):
            (self.root / name).unlink()
        with self._lock:
            self._total -= self._sizes.pop(name, 0)
        if name.endswith(self._suffix):  # this model's and layout's page: report it gone
            with contextlib.suppress(ValueError):
                self._removed.put(bytes.fromhex(name.removesuffix(self._suffix)))

    def _rescan(self) -> None:
        """Index every page file in the folder, least recently modified first (what this
        process used since keeps its place at the end)."""
        found = []
        for entry in os.scandir(self.root):
            if entry.name.endswith(".bin") and entry.is_file():
                st = entry.stat()
                found.append((st.st_mtime, entry.name, st.st_size))
        found.sort()
        with self._lock:
            known = self._sizes
            fresh: OrderedDict[str, int] = OrderedDict(
                (name, size) for _, name, size in found if name not in known
            )
            live = {name for _, name, _ in found}
            fresh.update((name, size) for name, size in known.items() if name in live)
            self._sizes = fresh
            self._total = sum(fresh.values())


def _pack(payload: bytes) -> bytes:
    digest = hashlib.sha256(payload).digest()
    return MAGIC + len(payload).to_bytes(8, "little") + digest + payload


def _unpack(raw: bytes) -> bytes | None:
    if len(raw) < HEADER_BYTES or not raw.startswith(MAGIC):
        return None
    length = int.from_bytes(raw[len(MAGIC) : len(MAGIC) + 8], "little")
    digest = raw[len(MAGIC) + 8 : HEADER_BYTES]
    payload = raw[HEADER_BYTES:]
    if len(payload) != length or hashlib.sha256(payload).digest() != digest:
        return None
    return payload


def _safe(tag: str) -> str:
    return "".join(c if c.isalnum() or c in "-." else "-" for c in tag)
