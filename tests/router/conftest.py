"""Router test fixtures: the engine's own SmolLM2 tokenizer (the in-process oracle) and one live
engine replica shared by every router test of a session (start-up costs ~25 s)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.engine.server.live_server import LiveServer, live_server


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
