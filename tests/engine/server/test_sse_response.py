"""SSEResponse closes its body generator when the client goes away, on every event loop: the
generator's `finally` (which aborts the requests behind the stream) must not wait for the
garbage collector."""

from __future__ import annotations

import asyncio
import contextlib
import gc
from collections.abc import AsyncGenerator
from typing import Any

import pytest
from starlette.requests import ClientDisconnect

from radixserve.engine.entrypoints.generation import SSEResponse


async def _serve_then_disconnect(spec_version: str) -> list[str]:
    """Serve an endless stream; the client leaves after the first event, the way uvicorn tells
    an app: ASGI 2.4 servers raise from `send` (Starlette then stops iterating), older ones
    send `http.disconnect` (Starlette then cancels the iteration)."""
    seen: list[str] = []
    sent_one = asyncio.Event()

    async def events() -> AsyncGenerator[bytes, None]:
        try:
            while True:
                yield b"data: x\n\n"
                await asyncio.sleep(0.01)
        finally:
            seen.append("closed")

    async def receive() -> dict[str, Any]:
        await sent_one.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        if sent_one.is_set() and spec_version == "2.4":
            raise OSError("client disconnected")  # uvicorn's ClientDisconnected is an OSError
        if message.get("body"):
            sent_one.set()

    scope = {"type": "http", "asgi": {"spec_version": spec_version}, "method": "POST"}
    scope["headers"] = []
    gc.disable()  # only an explicit close may run the generator's finally
    try:
        with contextlib.suppress(OSError, ClientDisconnect):  # what the server sees
            await SSEResponse(events())(scope, receive, send)
        seen.append("returned")
    finally:
        gc.enable()
    return seen


@pytest.mark.parametrize("spec_version", ["2.3", "2.4"])
@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_a_disconnect_closes_the_body_before_the_response_returns(
    loop: str, spec_version: str
) -> None:
    if loop == "uvloop":
        uvloop = pytest.importorskip("uvloop")
        seen = uvloop.run(_serve_then_disconnect(spec_version))
    else:
        seen = asyncio.run(_serve_then_disconnect(spec_version))
    assert seen == ["closed", "returned"]
