"""HiCache over a real Mooncake store: `mooncake_master` (from the PyPI wheel
mooncake-transfer-engine-non-cuda) on 127.0.0.1, two engine-side clients over TCP. Pages one
replica writes through its host tier are read back by another replica with the same KV bytes
(the oracle: the KV written into the first replica's pool), and a corrupt object is detected
and recomputed, never used."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from radixserve.engine.mem_cache.hicache_mooncake import HiCacheMooncake, MooncakeConfig
from tests.child_env import child_env
from tests.engine.mem_cache.test_hiradix_cache import World, seq
from tests.ports import free_port

pytest.importorskip("mooncake.store")
MASTER = shutil.which("mooncake_master") or str(Path(sys.executable).parent / "mooncake_master")


@pytest.fixture(scope="module")
def master(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = free_port()
    log = tmp_path_factory.mktemp("mooncake") / "master.log"
    with log.open("wb") as f:
        proc = subprocess.Popen(
            [MASTER, f"--rpc_port={port}", "--enable_http_metadata_server=false"],
            stdout=f,
            stderr=subprocess.STDOUT,
            env=child_env(),
        )
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


def test_another_replica_reads_the_prefix_from_mooncake(master: str) -> None:
    truth: dict = {}
    one, two = World(page=4, storage=client(master)), World(page=4, storage=client(master))
    try:
        a = seq(500, 16)
        one.put(a, truth)
        one.cache.storage.flush()  # type: ignore[union-attr]
        assert two.check_match([*a, 1], truth) == 16
        assert two.cache.stats.storage_hit_tokens == 16
    finally:
        one.cache.close()
        two.cache.close()


def test_a_corrupt_mooncake_object_is_recomputed(master: str) -> None:
    truth: dict = {}
    one, two = World(page=4, storage=client(master)), World(page=4, storage=client(master))
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
        assert two.check_match(a, truth) == 4  # the page before the corrupt one
    finally:
        one.cache.close()
        two.cache.close()
