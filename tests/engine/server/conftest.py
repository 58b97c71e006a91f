"""Live SmolLM2 servers shared by the HTTP tests of this folder: the default one, and one with
a tool-call and a reasoning parser."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.engine.server.live_server import LiveServer, live_server


@pytest.fixture(scope="session")
def server() -> Iterator[LiveServer]:
    with live_server("--max-total-tokens", "32768", "--max-queued-requests", "256") as srv:
        yield srv


# Structured outputs, tools and reasoning (test_structured_outputs.py, test_tool_calls.py).
STRUCTURED_ARGS = (
    "--max-total-tokens", "32768",
    "--tool-call-parser", "qwen25",
    "--reasoning-parser", "qwen3",
)  # fmt: skip


@pytest.fixture(scope="session")
def structured_server() -> Iterator[LiveServer]:
    with live_server(*STRUCTURED_ARGS) as srv:
        yield srv
