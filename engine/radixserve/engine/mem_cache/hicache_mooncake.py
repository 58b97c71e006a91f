"""HiCache's Mooncake store backend: KV pages as objects in a Mooncake distributed store
(`--hicache-storage-backend mooncake`), the pool that Mooncake's master coordinates and its
clients (each engine rank, and any standalone store client) contribute memory to.

Keys are the file backend's names (`{digest}_{model}-{dtype}_{rank}_{size}`), values the same
checksummed records (`hicache_storage._pack`), so a corrupt or cut object is recomputed, never
used. Writes go through one thread, as for the file backend. Capacity is the store's: its
master evicts objects when the pool is full and tells no client. So that routers can still
mirror the store (replicas with the same master address and layout share a storage id), a
sweeper thread asks the master every `sweep_interval_s` which of the last `SWEEP_KEYS` pages
this client wrote are gone, and reports them as deletions: the mirror learns of an eviction
within one sweep. Pages whose writer stopped are not swept by anyone (a stale mirror entry
costs a mis-scored route, never a wrong answer: a page that is missing is recomputed).
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from radixserve.engine.mem_cache.hicache_storage import HiCacheStorage, _pack, _safe, _unpack

logger = logging.getLogger(__name__)

SWEEP_KEYS = 1 << 16  # pages written here whose eviction the sweeper looks for (newest kept)
SWEEP_BATCH = 1024  # keys per existence query


@dataclass(frozen=True, slots=True)
class MooncakeConfig:
    master_server_address: str  # host:port of mooncake_master
    model_tag: str
    tp_rank: int = 0
    tp_size: int = 1
    local_hostname: str = "127.0.0.1"
    protocol: str = "tcp"
    device_name: str = ""
    global_segment_size: int = 1 << 30  # what this client lends the pool
    local_buffer_size: int = 256 << 20
    sweep_interval_s: float = 5.0


class HiCacheMooncake(HiCacheStorage):
    medium = "EXTERNAL"  # a store outside this host

    def __init__(self, config: MooncakeConfig, store: Any = None) -> None:
        self.config = config
        self._suffix = f"_{_safe(config.model_tag)}_{config.tp_rank}_{config.tp_size}"
        self.store = store if store is not None else _connect(config)
        self._lock = threading.Lock()  # guards _written (writer and sweeper threads)
        self._written: OrderedDict[bytes, None] = OrderedDict()
        self._stop = threading.Event()
        self._start_writer("hicache-mooncake")
        self._sweeper = threading.Thread(target=self._sweep_loop, name="hicache-sweep", daemon=True)
        self._sweeper.start()

    def key_of(self, digest: bytes) -> str:
        return digest.hex() + self._suffix

    def exists(self, digest: bytes) -> bool:
        return int(self.store.is_exist(self.key_of(digest))) == 1

    def get(self, digest: bytes) -> bytes | None:
        raw = self.store.get(self.key_of(digest))
        if not raw:
            return None
        payload = _unpack(bytes(raw))
        if payload is None:
            logger.warning("hicache mooncake: %s is corrupt; recomputing it", self.key_of(digest))
            self.store.remove(self.key_of(digest))
        return payload

    def used_bytes(self) -> int:
        return 0  # the store's pool is shared and its master keeps the count

    def storage_id(self) -> str:
        """The master's address as every replica is given it, + model + layout."""
        return f"mooncake:{self.config.master_server_address}{self._suffix}"

    def _close_backend(self) -> None:
        self._stop.set()
        self._sweeper.join(timeout=10)
        self.store.close()

    def _write(self, digest: bytes, payload: bytes) -> None:
        key = self.key_of(digest)
        if int(self.store.is_exist(key)) == 1:
            return
        rc = self.store.put(key, _pack(payload))
        if rc != 0:  # a full pool: the page is simply not stored
            logger.debug("hicache mooncake: put %s returned %s", key, rc)
            return
        with self._lock:
            self._written[digest] = None
            while len(self._written) > SWEEP_KEYS:
                self._written.popitem(last=False)

    # ---- sweeper thread: evictions the master made ----------------------------------------------

    def sweep(self) -> int:
        """Report the pages written here that the store no longer holds; returns how many."""
        with self._lock:
            digests = list(self._written)
        gone = []
        for i in range(0, len(digests), SWEEP_BATCH):
            batch = digests[i : i + SWEEP_BATCH]
            answers = self.store.batch_is_exist([self.key_of(d) for d in batch])
            gone += [d for d, a in zip(batch, answers, strict=True) if int(a) == 0]  # <0: error
        with self._lock:
            for d in gone:
                self._written.pop(d, None)
        for d in gone:
            self._removed.put(d)
        return len(gone)

    def _sweep_loop(self) -> None:
        while not self._stop.wait(self.config.sweep_interval_s):
            try:
                self.sweep()
            except Exception as exc:  # noqa: BLE001 - a lost master: try again next time
                logger.warning("hicache mooncake: sweep failed: %s", exc)


def _connect(config: MooncakeConfig) -> Any:
    from mooncake.store import MooncakeDistributedStore

    store = MooncakeDistributedStore()
    rc = store.setup(
        config.local_hostname,
        "P2PHANDSHAKE",
        config.global_segment_size,
        config.local_buffer_size,
        config.protocol,
        config.device_name,
        config.master_server_address,
    )
    if rc != 0:
        raise RuntimeError(
            f"hicache_storage_backend mooncake: setup against master "
            f"{config.master_server_address} failed ({rc})"
        )
    return store
