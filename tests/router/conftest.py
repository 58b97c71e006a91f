"""Router test fixtures: the engine's own SmolLM2 tokenizer (the in-process oracle) and one live
engine replica shared by every router test of a session (start-up costs ~25 s)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.engine.server.live_server import LiveServer, live_server
from tests.router.router_proc import Engine, EngineSet


@pytest.fixture(scope="session")
def engine_tokenizer(smollm_source: Any) -> Any:
    """The transformers tokenizer exactly as the engine loads it."""
    from radixserve.engine.model_loader.loader import load_tokenizer

    return load_tokenizer(smollm_source)


@pytest.fixture(scope="session")
def engine_server() -> Iterator[LiveServer]:
    """A real `radixserve serve` SmolLM2 replica on 127.0.0.1 (no KV-event stream)."""
    with live_server("--max-total-tokens", "32768", "--max-queued-requests", "256") as srv:
        yield srv


@pytest.fixture(scope="package")
def kv_engines() -> Iterator[EngineSet]:
    """Three SmolLM2 replicas with KV events (one CPU thread each), shared by the live router
    tests of this package (start-up ~60 s on 2 cores)."""
    engines = EngineSet.start(3)
    try:
        yield engines
    finally:
        engines.stop()


@pytest.fixture
def engines(kv_engines: EngineSet) -> list[Engine]:
    """The shared replicas, all alive (a killed one is restarted on its ports), caches empty."""
    kv_engines.revive()
    kv_engines.flush()
    return list(kv_engines.engines)
