"""The observability tests share one live run (engine + router, real traffic): see live_run."""

from __future__ import annotations

import pytest

from tests.observability.live_run import LiveRun, Scrape, live_run


@pytest.fixture(scope="package")
def live() -> LiveRun:
    return live_run()


@pytest.fixture(scope="package")
def scrape(live: LiveRun) -> Scrape:
    return live.scrape
