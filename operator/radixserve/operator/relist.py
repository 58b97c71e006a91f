"""An HTTP 410 Gone answered to a watch (or list) request makes kopf list again, instead of
ending the whole operator.

kube-apiserver says "your resourceVersion is too old" in two forms. Inside a watch stream it
is an `ERROR` event with code 410; kopf handles that one and lists again. As the answer to the
watch request itself it is an HTTP 410, and a paginated list whose continue token expired
gets the same; kopf raises that as `APIClientError`, its watcher task fails, and with it the
operator ("Resource observer has failed"). client-go's reflector treats both forms alike:
list again, watch from the new resourceVersion. `install()` makes kopf do the same, by
wrapping the one function its watchers stream from (`kopf._cogs.clients.watching
.infinite_watch`, looked up by `kopf._core.reactor.queueing` at call time). Each restart
lists the resource again, so no change made meanwhile is missed. Other errors are kopf's to
handle, as before.

kopf has no public hook for this; `install()` checks that the function it wraps is where it
expects and raises otherwise, so an upgrade of kopf that moves it fails loudly in the tests
(`tests/reliability/test_operator_faults.py`) rather than silently losing the fix.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

from kopf._cogs.clients import errors, watching
from kopf._core.reactor import queueing

logger = logging.getLogger(__name__)
GONE = 410
_MARK = "_radixserve_relists_on_gone"


def gone(exc: BaseException) -> bool:
    """Whether `exc` is the API server's 410 answer to a request (an expired resourceVersion
    or continue token)."""
    return isinstance(exc, errors.APIClientError) and exc.status == GONE


def relisting(stream: Callable[..., AsyncIterator[Any]]) -> Callable[..., AsyncIterator[Any]]:
    """`stream` (kopf's infinite_watch), started again, listing first, after each HTTP 410."""

    async def infinite_watch(**kwargs: Any) -> AsyncIterator[Any]:
        settings = kwargs["settings"]
        while True:
            try:
                async for event in stream(**kwargs):
                    yield event
                return
            except errors.APIClientError as exc:
                if not gone(exc):
                    raise
                logger.warning(
                    "the API server answered a watch of %s with 410 Gone: listing again",
                    kwargs.get("resource"),
                )
            await asyncio.sleep(settings.watching.reconnect_backoff)

    setattr(infinite_watch, _MARK, True)
    return infinite_watch


def install() -> None:
    """Wrap kopf's watch stream once per process (later calls change nothing)."""
    current = getattr(watching, "infinite_watch", None)
    if current is None or getattr(queueing, "watching", None) is not watching:
        raise RuntimeError(
            "kopf's watch stream is not where radixserve.operator.relist expects it "
            "(kopf._cogs.clients.watching.infinite_watch): check this kopf version"
        )
    if not getattr(current, _MARK, False):
        watching.infinite_watch = relisting(current)
