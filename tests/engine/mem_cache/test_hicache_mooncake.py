"""HiCache over a real Mooncake store: `mooncake_master` (from the PyPI wheel
mooncake-transfer-engine-non-cuda) on 127.0.0.1, two engine-side clients over TCP. Pages one
replica writes through its host tier are read back by another replica with the same KV bytes
(the oracle: the KV written into the first replica's pool), and a corrupt object is detected
and recomputed, never used."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from radixserve.engine.mem_cache.hicache_mooncake import HiCacheMooncake, MooncakeConfig
from radixserve.protocol import BlockRemoved
from radixserve.protocol.block_hash import digest_to_int64
from tests.child_env import child_env
from tests.engine.mem_cache.test_hiradix_cache import World, seq
from tests.ports import free_port

pytest.importorskip("mooncake.store")
MASTER = shutil.which("mooncake_master") or str(Path(sys.executable).parent / "mooncake_master")


@pytest.fixture(scope="module")
def master(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with running_master(tmp_path_factory.mktemp("mooncake")) as address:
        yield address


@contextlib.contextmanager
def running_master(folder: Path) -> Iterator[str]:
    port = free_port()
    log = folder / "master.log"
    with log.open("wb") as f:
        proc = subprocess.Popen(
            # its own metrics port too: two masters on one host would share 9003
            [
                MASTER, f"--rpc_port={port}", f"--metrics_port={free_port()}",
                "--enable_http_metadata_server=false",
            ],
            stdout=f,
            stderr=subprocess.STDOUT,
            env=child_env(),
        )  # fmt: skip
    try:
        time.sleep(1.0)  # it serves RPC within a few ms; a client's setup retries anyway
        assert proc.poll() is None, log.read_text()
        yield f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(10)


def client(master: str) -> HiCacheMooncake:
    return HiCacheMooncake(
        MooncakeConfig(
            master, "test-model", global_segment_size=32 << 20, local_buffer_size=8 << 20
        )
    )


@pytest.fixture(scope="module")
def clients(master: str) -> Iterator[tuple[HiCacheMooncake, HiCacheMooncake]]:
    """Two replicas' store clients, made once (a client takes 2 s to close)."""
    one, two = client(master), client(master)
    yield one, two
    one.close()
    two.close()


def replicas(clients: tuple[HiCacheMooncake, HiCacheMooncake]) -> tuple[World, World]:
    return World(page=4, storage=clients[0]), World(page=4, storage=clients[1])


def stop(*worlds: World) -> None:
    """Stop the worlds' prefetch threads; their store clients stay open for the next test."""
    for w in worlds:
        assert w.cache.prefetcher is not None
        w.cache.prefetcher.close()


def test_another_replica_reads_the_prefix_from_mooncake(clients: Any) -> None:
    truth: dict = {}
    one, two = replicas(clients)
    try:
        a = seq(500, 16)
        one.put(a, truth)
        one.cache.storage.flush()  # type: ignore[union-attr]
        two.fetch([*a, 1])
        assert two.check_match([*a, 1], truth) == 16
        assert two.cache.stats.storage_hit_tokens == 16
        # the router hears of the store's pages (EXTERNAL), and of the ones it evicts
        stored = [e for e in one.cache.take_events() if getattr(e, "medium", "") == "EXTERNAL"]
        assert sum(len(e.block_hashes) for e in stored) == 4
        store = one.cache.storage
        assert isinstance(store, HiCacheMooncake)
        b = seq(700, 8)  # read by nobody (a read leases an object against removal)
        one.put(b, truth)
        store.flush()
        digest = one.cache.match_prefix(b).last_node.page_digests[-1]
        one.cache.take_events()
        assert store.store.remove(store.key_of(digest)) == 0  # as the master's eviction does
        assert store.sweep() == 1
        removed = [e for e in one.cache.take_events() if isinstance(e, BlockRemoved)]
        assert [(e.medium, e.block_hashes) for e in removed] == [
            ("EXTERNAL", [digest_to_int64(digest)])
        ]
    finally:
        stop(one, two)


def test_a_corrupt_mooncake_object_is_recomputed(clients: Any) -> None:
    truth: dict = {}
    one, two = replicas(clients)
    try:
        a = seq(900, 16)
        one.put(a, truth)
        store = one.cache.storage
        assert isinstance(store, HiCacheMooncake)
        store.flush()
        digest = one.cache.match_prefix(a).last_node.page_digests[1]
        key = store.key_of(digest)
        store.store.remove(key)
        assert store.store.put(key, b"not a page") == 0
        two.fetch(a)
        assert two.check_match(a, truth) == 4  # the page before the corrupt one
    finally:
        stop(one, two)


def test_replicas_of_one_master_share_a_storage_id(master: str, clients: Any) -> None:
    one, two = clients
    assert one.storage_id() == two.storage_id() == f"mooncake:{master}_test-model_0_1"


def test_the_sweeper_reports_the_pages_the_master_evicted(tmp_path: Path) -> None:
    """A pool of 16 MiB and 40 pages of 1 MiB: the master evicts (nobody is told), and the
    sweep finds exactly the pages that are gone, so the router's mirror can drop them."""
    with running_master(tmp_path) as address:
        config = MooncakeConfig(
            address, "evict-test", global_segment_size=16 << 20, local_buffer_size=8 << 20,
            sweep_interval_s=3600,
        )  # fmt: skip
        store = HiCacheMooncake(config)
        try:
            digests = [i.to_bytes(32, "little") for i in range(40)]
            for d in digests:
                store.set_async(d, os.urandom(1 << 20))
            store.flush()
            gone = 0
            deadline = time.monotonic() + 10
            while gone == 0 and time.monotonic() < deadline:
                gone = store.sweep()  # the master evicts in the background
                time.sleep(0.1)
            removed = store.take_removed()
            assert len(removed) == gone > 0
            assert not any(store.exists(d) for d in removed)
            assert store.sweep() == 0  # each eviction is reported once
        finally:
            store.close()
