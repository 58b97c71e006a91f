"""A pytest plugin (tests/conftest.py loads it): one co-located server and one prefill/decode
pair with pd_servers.COMMON's flags, shared by the modules whose tests leave them as they found
them (tests/engine/disaggregation/test_pd_servers.py, tests/router/test_router_pd.py). Each of
those modules started both on its own before, 20 to 30 s of start-up each time on 2 cores.

- Session-scoped, so the second module finds them started; a test that breaks a server on
  purpose (a fault, a kill) keeps servers of its own (test_pd_faults.py, the odd decodes).
- The modules that use them run one after the other: collection moves every module that uses
  them next to the first one (each module's tests stay in their order).
- They stop right after the last test that uses them, not at the end of the session: three
  idle servers hold about 1.5 GB each.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

import pytest

from tests.engine.disaggregation.pd_servers import COMMON, Pair, pd_pair
from tests.engine.server.live_server import LiveServer, live_server

# An aborted decode room keeps its pages for a write still under way (30 s by default):
# shortened, so test_pd_servers.py's abort test finds both sides at rest sooner. No test of
# either module writes late; the router tests only wait for "at rest", which comes sooner too.
PAIR_ENV = {"SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE_TIMEOUT": "4"}

SHARED = ("pd_shared_colocated", "pd_shared_pair")

_open: dict[str, ExitStack] = {}  # fixture name → what stops its servers, while they run
_users: dict[str, set[str]] = {}  # fixture name → node ids of the tests still to run with it


@contextmanager
def _held(name: str) -> Iterator[ExitStack]:
    with ExitStack() as stack:
        _open[name] = stack
        try:
            yield stack
        finally:
            _open.pop(name, None)


@pytest.fixture(scope="session")
def pd_shared_colocated() -> Iterator[LiveServer]:
    with _held("pd_shared_colocated") as stack:
        yield stack.enter_context(live_server(*COMMON))


@pytest.fixture(scope="session")
def pd_shared_pair() -> Iterator[Pair]:
    with _held("pd_shared_pair") as stack:
        yield stack.enter_context(pd_pair(env=PAIR_ENV))


def _module(item: pytest.Item) -> str:
    return item.nodeid.split("::", 1)[0]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every module with a test that uses a shared fixture runs right after the first such
    module, in collection order; all other tests keep their order."""
    modules = dict.fromkeys(
        _module(item) for item in items if any(n in item.fixturenames for n in SHARED)
    )
    if len(modules) < 2:
        return
    moved = [item for item in items if _module(item) in modules]
    first = items.index(moved[0])  # nothing before it is in `modules`
    rest = [item for item in items if _module(item) not in modules]
    items[:] = rest[:first] + moved + rest[first:]


def pytest_collection_finish(session: pytest.Session) -> None:
    for name in SHARED:
        _users[name] = {item.nodeid for item in session.items if name in item.fixturenames}


@pytest.hookimpl(trylast=True)  # after the item's own fixtures are torn down
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    for name, users in _users.items():
        users.discard(item.nodeid)
        if not users and name in _open:
            _open.pop(name).close()
