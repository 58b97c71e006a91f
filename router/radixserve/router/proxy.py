"""Forwarding one request to a worker: retries before the first byte, pass-through after.

- Each attempt takes a lease from the selector (which excludes workers already tried) and
  sends the client's body as it came (it was parsed, not changed), or with
  `data_parallel_rank` added for a worker with DP ranks.
- Before anything reached the client, a transport error or a retryable status (408, 429,
  5xx) is retried on another worker with exponential backoff and jitter. A refused
  connection also marks the worker unhealthy at once (a dead worker gets no new requests).
- A non-streaming answer is read whole before the client sees a byte, so it can still be
  retried when the worker dies mid-body.
- A stream is forwarded chunk by chunk as the worker writes it (no buffering). If the worker
  dies after the first byte, the client gets one SSE error event and `data: [DONE]`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
from collections.abc import AsyncIterator
from typing import Any

from fastapi.responses import Response, StreamingResponse
from starlette.datastructures import Headers

from radixserve.protocol.http_edge import SSE_DONE, error_response, sse_error
from radixserve.router.config import RouterConfig
from radixserve.router.metrics import RouterMetrics
from radixserve.router.selector import Lease, Selector
from radixserve.router.upstream import ConnectFailed, Upstream, UpstreamError, UpstreamResponse
from radixserve.router.workers import WorkerRegistry

logger = logging.getLogger(__name__)

RETRYABLE_STATUS = frozenset({408, 429, 500, 502, 503, 504})
FORWARDED_HEADERS = frozenset({b"authorization", b"x-request-id", b"traceparent"})
NO_WORKER_RETRY_AFTER_S = 5


def no_worker_response() -> Response:
    """503 with Retry-After: nothing to route to (yet); clients and probes should come back."""
    return error_response(
        "no healthy worker is available",
        503,
        headers={"Retry-After": str(NO_WORKER_RETRY_AFTER_S)},
    )


class Proxy:
    def __init__(
        self,
        config: RouterConfig,
        upstream: Upstream,
        selector: Selector,
        registry: WorkerRegistry,
        metrics: RouterMetrics,
    ) -> None:
        self.config = config
        self.upstream = upstream
        self.selector = selector
        self.registry = registry
        self.metrics = metrics

    async def forward(  # noqa: PLR0913 - one request: where, what (raw and parsed), how routed
        self,
        route: str,
        raw: bytes,
        body: dict[str, Any],
        key: bytes | None,
        headers: Headers,
    ) -> Response:
        """`key`: the prompt's ids as `encode_tokens` bytes (None: routed without them)."""
        session = headers.get(self.config.session_header) if self.config.session_header else None
        tried: set[str] = set()
        last: Response | None = None
        for attempt in range(self.config.retry_max_attempts):
            if attempt:
                self.metrics.retries.inc()
                await asyncio.sleep(self.backoff(attempt))
            lease = self.selector.choose_encoded(key or b"", session, exclude=tried)
            if lease is None:
                break
            self._count_decision(lease)
            tried.add(lease.worker.url)
            result = await self._attempt(lease, route, raw, body, headers)
            if result is not None and not self.retryable(result):
                return result
            last = result or last
        if last is not None:
            return last
        return no_worker_response()

    def retryable(self, resp: Response) -> bool:
        return resp.status_code in RETRYABLE_STATUS and not isinstance(resp, StreamingResponse)

    def backoff(self, attempt: int) -> float:
        c = self.config
        delay = min(c.retry_initial_backoff_s * 1.5 ** (attempt - 1), c.retry_max_backoff_s)
        return delay * random.uniform(0.8, 1.2)

    def _count_decision(self, lease: Lease) -> None:
        self.metrics.decision.observe(lease.decision_s)
        self.metrics.count_routed(lease.worker.url, lease.num_tokens, lease.cached_tokens)

    async def _attempt(  # noqa: PLR0913 - one try of forward's request
        self,
        lease: Lease,
        route: str,
        raw: bytes,
        body: dict[str, Any],
        headers: Headers,
    ) -> Response | None:
        """One try; None on a transport error before any answer (the lease is released)."""
        worker = lease.worker
        try:
            resp = await self.upstream.post(
                worker.url,
                route,
                self._body_for(lease, raw, body),
                self.headers_for(lease, headers),
            )
        except UpstreamError as exc:
            await self.failed(lease, route, exc)
            return None
        worker.breaker.record(resp.status < 500)
        if bool(body.get("stream")) and resp.status == 200:
            return self._stream(lease, route, resp)
        try:
            content = await resp.read()
        except UpstreamError as exc:
            await self.failed(lease, route, exc)
            return None
        finally:
            resp.release()  # back to the pool when read whole, else closed
            lease.release()
        self.metrics.count_request(worker.url, route, str(resp.status))
        media = resp.header("content-type", "application/json")
        return Response(content, status_code=resp.status, media_type=media)

    async def failed(self, lease: Lease, route: str, exc: UpstreamError) -> None:
        lease.release()
        worker = lease.worker
        worker.breaker.record(False)
        self.metrics.count_request(worker.url, route, "transport_error")
        logger.info("request to worker failed url=%s error=%r", worker.url, exc)
        if isinstance(exc, ConnectFailed):  # nothing listens: unambiguous, act now
            await self.registry.mark_unhealthy(worker, f"request failed: {type(exc).__name__}")
        else:
            self._recheck(lease)

    def _stream(self, lease: Lease, route: str, resp: UpstreamResponse) -> StreamingResponse:
        async def chunks() -> AsyncIterator[bytes]:
            outcome = "200"
            try:
                async for chunk in resp.stream():  # as the bytes arrive
                    yield chunk
            except UpstreamError as exc:
                outcome = "stream_error"
                lease.worker.breaker.record(False)
                logger.info("stream broke url=%s error=%r", lease.worker.url, exc)
                # The engine's in-stream error event, then the end marker clients wait for.
                yield sse_error(f"worker {lease.worker.url} failed mid-stream: {exc}", 502)
                yield SSE_DONE
                self._recheck(lease)
            finally:
                resp.release()  # back to the pool when read whole, else closed: an abort
                lease.release()
                self.metrics.count_request(lease.worker.url, route, outcome)

        media = resp.header("content-type", "text/event-stream")
        return StreamingResponse(chunks(), status_code=resp.status, media_type=media)

    def _recheck(self, lease: Lease) -> None:
        """A broken stream may mean a dead worker: check now rather than at the next tick."""
        task = asyncio.get_running_loop().create_task(self.registry.check(lease.worker))
        task.add_done_callback(lambda t: t.exception() if not t.cancelled() else None)

    def _body_for(self, lease: Lease, raw: bytes, body: dict[str, Any]) -> bytes:
        if lease.worker.dp_size > 1:
            pinned = {**body, "data_parallel_rank": lease.dp_rank}
            return json.dumps(pinned, ensure_ascii=False, allow_nan=False).encode()
        return raw

    def headers_for(self, lease: Lease, headers: Headers) -> dict[str, str]:
        # from the raw pairs (names are lower case in ASGI): Headers.items() looks each one up
        out = {
            k.decode("latin-1"): v.decode("latin-1")
            for k, v in headers.raw
            if k in FORWARDED_HEADERS
        }
        out["content-type"] = "application/json"
        out.update(lease.worker.headers())  # the worker's own key wins over the client's
        return out
