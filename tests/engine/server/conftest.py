"""One live SmolLM2 server shared by the HTTP tests of this folder."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.engine.server.live_server import LiveServer, live_server


@pytest.fixture(scope="session")
def server() -> Iterator[LiveServer]:
    with live_server("--max-total-tokens", "32768", "--max-queued-requests", "256") as srv:
        yield srv
