"""The proxied routes' lean path: every inference request of every tenant, served by one plain
ASGI function instead of the app's middleware stack.

FastAPI serves the proxied routes too (`app.install_inference_routes`: the reference path, and
what /openapi.json describes), through ten layers: the request id, Starlette's and FastAPI's
error, telemetry, body-limit and exit-stack middleware, the internal-error guard, the body
limit, the API key, routing. Each wraps receive and send once more for every message. Here the
same steps run in one function, in the stack's order, with the same answers:
1. the request id: the client's X-Request-ID, else a fresh one that the worker is sent too; it
   is in REQUEST_ID for the request's log records and on every answer (asgi_errors);
2. an exception before the answer started is the logged JSON 500 naming the id, after it the
   connection is cut (asgi_errors.InternalErrorMiddleware);
3. a Content-Length over the body limit is the 413 naming it (asgi_errors.BodyLimitMiddleware),
   before the key is checked;
4. without the API key, the 401 (http_edge.ApiKeyMiddleware);
5. the body is read, a 413 as soon as it passes the limit; then parsed (a 400 naming the
   field), tokenized and forwarded (`answer`, shared with the reference path);
6. a stream is sent as Starlette's StreamingResponse sends it, and as there, a client that
   leaves cancels it (the worker's connection is closed: the engine aborts the request), but
   without the task group it opens for every stream: one task waits for the disconnect.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from typing import Any

from starlette.datastructures import Headers
from starlette.requests import ClientDisconnect
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.types import Message, Receive, Scope, Send

from radixserve.asgi_errors import EdgeConfig, body_too_large_body, internal_error_body
from radixserve.logging_setup import REQUEST_ID, REQUEST_ID_HEADER
from radixserve.protocol.http_edge import API_KEY_REFUSED, bearer_matches, error_response
from radixserve.protocol.json_body import BodyError, parse_json_object
from radixserve.router.state import RouterState

logger = logging.getLogger("radixserve.asgi_errors")  # the guard's records, as before
PROXIED_ROUTES = ("/generate", "/v1/completions", "/v1/chat/completions")
OFFLOAD_TOKENIZE_BYTES = 64 * 1024  # bodies above this are tokenized on a worker thread


class _BodyTooLarge(Exception):
    pass


async def routing_key(
    state: RouterState, route: str, body: dict[str, Any], body_bytes: int
) -> bytes | None:
    """The prompt's ids as the trees' key (`encode_tokens` bytes); None: routed without it."""
    tokenizer = await state.tokenizers.get(state.registry)
    if tokenizer is None:
        return None
    start = time.perf_counter()
    try:
        if body_bytes > OFFLOAD_TOKENIZE_BYTES:  # ~1 ms per 1.5k tokens: keep the loop free
            key = await asyncio.to_thread(tokenizer.routing_key, route, body)
        else:
            key = tokenizer.routing_key(route, body)
    except ValueError:
        return None  # e.g. a chat template error: the worker will answer it with a 400
    state.metrics.tokenize.observe(time.perf_counter() - start)
    return key


async def answer(state: RouterState, route: str, raw: bytes, headers: Headers) -> Response:
    """A proxied request's answer: the 400 naming the field of a body that is no JSON object
    (or holds NaN/Infinity), else the worker's."""
    try:
        body = parse_json_object(raw)
    except BodyError as exc:
        return error_response(str(exc), 400, exc.field)
    key = await routing_key(state, route, body, len(raw))
    return await state.forwarder.forward(route, raw, body, key, headers)


class LeanProxiedRoutes:
    """`await lean(scope, receive, send)` for a POST to one of PROXIED_ROUTES."""

    def __init__(self, state: RouterState, edge: EdgeConfig, max_body_bytes: int) -> None:
        self.state = state
        self.api_key = edge.api_key
        self.max_bytes = max_body_bytes
        # fresh request ids: 128 random bits as 32 hex digits, uuid4().hex's shape, from a
        # generator seeded by the OS once (uuid4 asks the OS for every id: ~2 µs, this ~0.3)
        self._ids = random.Random()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        raw_headers: list[tuple[bytes, bytes]] = scope["headers"]
        last = dict(raw_headers)  # the last of repeated headers, as each middleware read them
        rid = last.get(REQUEST_ID_HEADER, b"").decode()
        if not rid:
            rid = f"{self._ids.getrandbits(128):032x}"
            scope["headers"] = raw_headers = [*raw_headers, (REQUEST_ID_HEADER, rid.encode())]
        REQUEST_ID.set(rid)
        scope.setdefault("state", {})["request_id"] = rid
        started = False
        rid_header = (REQUEST_ID_HEADER, rid.encode())

        async def send_with_id(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                message["headers"] = [*message.get("headers", []), rid_header]
            await send(message)

        try:
            await self._serve(scope, receive, send_with_id, last, raw_headers)
        except Exception as exc:
            logger.exception(
                "internal error in %s %s (request id %s)", scope["method"], scope["path"], rid
            )
            if started:  # too late for a status: the connection is cut
                raise
            body = internal_error_body(exc, rid)
            out = JSONResponse(body, status_code=500, headers={REQUEST_ID_HEADER.decode(): rid})
            await out(scope, receive, send)

    async def _serve(  # noqa: PLR0913 - the ASGI triple and the headers, read once
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        last: dict[bytes, bytes],
        raw_headers: list[tuple[bytes, bytes]],
    ) -> None:
        length = last.get(b"content-length", b"")
        if length.isdigit() and int(length) > self.max_bytes:
            await self._too_large(scope, receive, send)
            return
        if self.api_key and not bearer_matches(last.get(b"authorization", b""), self.api_key):
            await error_response(API_KEY_REFUSED, 401)(scope, receive, send)
            return
        try:
            raw = await self._body(receive)
        except _BodyTooLarge:
            await self._too_large(scope, receive, send)
            return
        response = await answer(self.state, scope["path"], raw, Headers(raw=raw_headers))
        if isinstance(response, StreamingResponse):
            await send_stream(response, receive, send)
        else:
            await response(scope, receive, send)

    async def _body(self, receive: Receive) -> bytes:
        """The whole body; _BodyTooLarge once it passes the limit; ClientDisconnect (a logged
        internal error, as Starlette's request.body() makes it) when the client leaves."""
        chunks: list[bytes] = []
        seen = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise ClientDisconnect()
            chunk = message.get("body", b"")
            seen += len(chunk)
            if seen > self.max_bytes:
                raise _BodyTooLarge
            chunks.append(chunk)
            if not message.get("more_body", False):
                return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    async def _too_large(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = body_too_large_body(self.max_bytes)
        out = JSONResponse(body, status_code=413, headers={"Connection": "close"})
        await out(scope, receive, send)


async def send_stream(response: StreamingResponse, receive: Receive, send: Send) -> None:
    """Send `response`'s messages; when the client disconnects, stop at once (its iterator is
    closed, so the worker's connection is too) and return as Starlette does."""
    task = asyncio.current_task()
    assert task is not None
    left = False

    async def watch() -> None:
        nonlocal left
        while (await receive())["type"] != "http.disconnect":
            pass
        left = True
        task.cancel()

    watcher = asyncio.get_running_loop().create_task(watch())
    chunks = response.body_iterator
    try:
        await send({"type": "http.response.start", "status": response.status_code,
                    "headers": response.raw_headers})  # fmt: skip
        async for chunk in chunks:
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        watcher.cancel()  # before the end: then receive() says disconnect, the client stayed
        await send({"type": "http.response.body", "body": b"", "more_body": False})
    except asyncio.CancelledError:
        if not left:  # not the client's doing (the server shuts down)
            raise
        if hasattr(task, "uncancel"):  # Python 3.11+: the task is not being cancelled any more
            task.uncancel()
    finally:
        watcher.cancel()
        await chunks.aclose()  # type: ignore[attr-defined]  # an async generator's
