"""Router test fixtures: the engine's own SmolLM2 tokenizer (the in-process oracle) and three
live engine replicas with KV events, shared by every router test of this package."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from tests.router.router_proc import Engine, EngineSet


@pytest.fixture(scope="session")
def engine_tokenizer(smollm_source: Any) -> Any:
    """The transformers tokenizer exactly as the engine loads it."""
    from radixserve.engine.model_loader.loader import load_tokenizer

    return load_tokenizer(smollm_source)


@dataclass(frozen=True)
class ServerURL:
    base_url: str


@pytest.fixture(scope="package")
def engine_server(kv_engines: EngineSet) -> ServerURL:
    """One live SmolLM2 replica for HTTP-level checks: the first of the shared replicas (a
    server of its own would cost another ~45 s of start-up)."""
    kv_engines.revive()
    return ServerURL(kv_engines.engines[0].url)


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


@pytest.fixture(scope="package")
def engine(engine_tokenizer: Any) -> Any:
    """The engine's request parsers over its tokenizer (test_tokenization.EngineSide)."""
    from tests.router.test_tokenization import engine_side

    return engine_side(engine_tokenizer)


@pytest.fixture(scope="package")
def router_tok(engine_tokenizer: Any) -> Any:
    """The router's tokenizer, from the engine's /get_tokenizer answer through JSON, as the
    router receives it."""
    import json

    from radixserve.engine.entrypoints.http_server import tokenizer_info
    from radixserve.router.tokenization import RouterTokenizer

    return RouterTokenizer.from_info(json.loads(json.dumps(tokenizer_info(engine_tokenizer))))
