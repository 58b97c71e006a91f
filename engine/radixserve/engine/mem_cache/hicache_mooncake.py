"""HiCache's Mooncake store backend: KV pages as objects in a Mooncake distributed store
(`--hicache-storage-backend mooncake`), the pool that Mooncake's master coordinates and its
clients (each engine rank, and any standalone store client) contribute memory to.

Keys are the file backend's names (`{digest}_{model}-{dtype}_{rank}_{size}`), values the same
checksummed records (`hicache_storage._pack`), so a corrupt or cut object is recomputed, never
used. Writes go through one thread, as for the file backend. Capacity is the store's: its
master evicts objects when the pool is full, and says nothing of it, so this backend reports
no deletions and no storage id (the router cannot mirror what it is never told about).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from radixserve.engine.mem_cache.hicache_storage import HiCacheStorage, _pack, _safe, _unpack

logger = logging.getLogger(__name__)


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


class HiCacheMooncake(HiCacheStorage):
    def __init__(self, config: MooncakeConfig, store: Any = None) -> None:
        self.config = config
        self._suffix = f"_{_safe(config.model_tag)}_{config.tp_rank}_{config.tp_size}"
        self.store = store if store is not None else _connect(config)
        self._start_writer("hicache-mooncake")

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

    def storage_id(self) -> str | None:
        return None

    def take_removed(self) -> list[bytes]:
        return []

    def _close_backend(self) -> None:
        self.store.close()

    def _write(self, digest: bytes, payload: bytes) -> None:
        key = self.key_of(digest)
        if int(self.store.is_exist(key)) != 1:
            rc = self.store.put(key, _pack(payload))
            if rc != 0:  # a full pool: the page is simply not stored
                logger.debug("hicache mooncake: put %s returned %s", key, rc)


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
