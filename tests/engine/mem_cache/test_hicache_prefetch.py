"""Storage prefetch under each `--hicache-storage-prefetch-policy`, over a real file store whose
reads a test can hold back (a slow disk, a store under load): what a waiting request may take
and when, the threshold, the bound on staged pages, a tree that changed during the read, and
a backend that fails. The KV oracle is World's: every slot a match returns holds the true KV.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import torch

from radixserve.engine.mem_cache.hicache_prefetch import PrefetchConfig
from radixserve.engine.mem_cache.hicache_storage import HiCacheFile, StorageConfig
from tests.engine.mem_cache.test_hiradix_cache import World, seq

PAGE = 4


class GatedFile(HiCacheFile):
    """A file store whose page reads wait for `release(n)` (n reads), or fail when told."""

    def __init__(self, path: Path) -> None:
        super().__init__(StorageConfig(path, 1 << 30, "test-model"))
        self.gate = threading.Semaphore(0)
        self.reads = 0
        self.fail = False

    def release(self, n: int = 1000) -> None:
        for _ in range(n):
            self.gate.release()

    def get(self, digest: bytes) -> bytes | None:
        assert self.gate.acquire(timeout=10)
        if self.fail:
            raise ConnectionError("store went away")
        self.reads += 1
        return super().get(digest)


def written(path: Path, truth: dict[tuple[int, ...], torch.Tensor], tokens: list[int]) -> None:
    """Another replica computed `tokens` and wrote them to the shared folder."""
    one = World(page=PAGE, storage=HiCacheFile(StorageConfig(path, 1 << 30, "test-model")))
    one.put(tokens, truth)
    one.cache.close()  # lets its writes land


def stored(path: Path, n: int = 32) -> tuple[dict[tuple[int, ...], torch.Tensor], list[int]]:
    """An n-token prompt another replica wrote to the folder: (its KV truth, the prompt)."""
    truth: dict[tuple[int, ...], torch.Tensor] = {}
    prompt = seq(0, n)
    written(path, truth, prompt)
    return truth, prompt


def reader(path: Path, policy: str, **config: float) -> tuple[World, GatedFile]:
    store = GatedFile(path)
    prefetch = PrefetchConfig(policy, **{"threshold": 0, **config})  # type: ignore[arg-type]
    return World(page=PAGE, storage=store, prefetch=prefetch), store


def wait_until(cond: object, seconds: float = 10) -> None:
    deadline = time.monotonic() + seconds
    while not cond():  # type: ignore[operator]
        assert time.monotonic() < deadline
        time.sleep(0.001)


def test_wait_complete_holds_the_request_until_every_page_landed(tmp_path: Path) -> None:
    truth, prompt = stored(tmp_path)
    w, store = reader(tmp_path, "wait_complete")
    w.cache.prefetch("a", prompt)
    store.release(3)
    wait_until(lambda: store.reads == 3)
    assert not w.cache.prefetch_ready("a", prompt)  # 3 of 8 pages: it waits
    assert w.cache.stats.prefetch_deferrals == 1
    store.release()
    wait_until(lambda: w.cache.prefetch_ready("a", prompt))
    assert w.check_match(prompt, truth) == 32
    assert w.cache.stats.storage_hit_tokens == 32
    assert w.cache.prefetcher.staged_bytes() == 0  # type: ignore[union-attr]
    w.cache.close()


def test_best_effort_goes_at_once_with_what_landed(tmp_path: Path) -> None:
    truth, prompt = stored(tmp_path)
    w, store = reader(tmp_path, "best_effort")
    w.cache.prefetch("a", prompt)
    store.release(2)
    wait_until(lambda: store.reads == 2)
    assert w.cache.prefetch_ready("a", prompt)  # never waits: 2 pages landed, 6 recomputed
    store.release()
    assert w.check_match(prompt, truth) == 2 * PAGE
    assert w.cache.stats.storage_hit_tokens == 2 * PAGE
    w.cache.close()


def test_timeout_waits_its_deadline_then_takes_what_landed(tmp_path: Path) -> None:
    truth, prompt = stored(tmp_path)
    w, store = reader(tmp_path, "timeout", timeout_base=0.2, timeout_per_ki_token=0.0)
    w.cache.prefetch("a", prompt)
    store.release(3)
    wait_until(lambda: store.reads == 3)
    first = time.monotonic()
    assert not w.cache.prefetch_ready("a", prompt)  # the clock starts at this first refusal
    wait_until(lambda: w.cache.prefetch_ready("a", prompt))
    assert time.monotonic() - first >= 0.2
    store.release()
    assert w.check_match(prompt, truth) == 3 * PAGE
    w.cache.close()


def test_a_short_storage_hit_is_not_read(tmp_path: Path) -> None:
    truth, prompt = stored(tmp_path, 8)
    w, store = reader(tmp_path, "wait_complete", threshold=16)
    store.release()
    w.cache.prefetch("a", [*prompt, *seq(100, 16)])  # 24 tokens to look up, 8 stored
    wait_until(lambda: w.cache.prefetch_ready("a", prompt))
    assert store.reads == 0
    assert w.check_match(prompt, truth) == 0
    w.cache.close()


def test_staged_pages_are_bounded_by_half_the_host_pool(tmp_path: Path) -> None:
    truth, prompt = stored(tmp_path, 64)
    store = GatedFile(tmp_path)
    prefetch = PrefetchConfig("wait_complete", threshold=0)
    w = World(page=PAGE, pool=128, host=32, storage=store, prefetch=prefetch)
    store.release()
    w.fetch(prompt)
    assert store.reads == 4  # 16 tokens: half of the host pool of 32
    assert w.check_match(prompt, truth) == 16
    w.cache.close()


def test_a_prefix_the_tree_gained_meanwhile_is_not_loaded_twice(tmp_path: Path) -> None:
    truth, prompt = stored(tmp_path)
    w, store = reader(tmp_path, "wait_complete")
    w.cache.prefetch("a", prompt)
    w.put(prompt[:16], truth)  # another request computed the first half meanwhile
    store.release()
    wait_until(lambda: w.cache.prefetch_ready("a", prompt))
    assert w.cache.stats.prefetch_tokens == 16  # only the part the tree lacked
    assert w.check_match(prompt, truth) == 32
    w.cache.close()


def test_a_prefix_the_tree_lost_meanwhile_is_read_again(tmp_path: Path) -> None:
    """The read covers what follows the tree's match; when that match is evicted for room
    before the request goes, the pages would follow a gap: they are read again, from where
    the tree ends now, and the request waits for that."""
    truth, prompt = stored(tmp_path)
    w, store = reader(tmp_path, "wait_complete")
    w.put(prompt[:16], truth)
    w.cache.prefetch("a", prompt)  # reads tokens 16..31 only
    store.release()
    w.cache.wait_prefetch(10)  # until the read finished
    w.cache.evict(64)
    w.cache.evict_host(64)  # the first half is gone from every tier here
    assert not w.cache.prefetch_ready("a", prompt)  # read again, from token 0
    assert w.cache.stats.prefetch_lost_tokens == 16
    wait_until(lambda: w.cache.prefetch_ready("a", prompt))
    assert w.check_match(prompt, truth) == 32
    w.cache.close()


def test_a_failing_store_costs_a_recompute_and_nothing_else(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    truth, prompt = stored(tmp_path)
    w, store = reader(tmp_path, "wait_complete")
    store.fail = True
    store.release()
    w.fetch(prompt)
    assert "storage read failed" in caplog.text
    assert w.check_match(prompt, truth) == 0
    store.fail = False
    w.fetch(prompt, rid="b")  # the next request reads it
    assert w.check_match(prompt, truth) == 32
    w.cache.close()


def test_requests_that_left_the_queue_release_their_staged_pages(tmp_path: Path) -> None:
    truth, prompt = stored(tmp_path)
    w, store = reader(tmp_path, "wait_complete")
    store.release()
    w.cache.prefetch("gone", prompt)
    prefetcher = w.cache.prefetcher
    assert prefetcher is not None
    wait_until(lambda: prefetcher.staged_bytes() > 0 and prefetcher.pending() == 0)
    w.cache.drop_prefetches(set())  # aborted while waiting
    assert prefetcher.staged_bytes() == 0
    assert w.cache.prefetches_in_flight() == 0
    assert w.check_match(prompt, truth) == 0
    w.cache.close()
