"""Prefill/decode disaggregation (`--pd-disaggregation`, sglang-router's PD mode): one request
goes to a prefill worker and a decode worker at once, with the bootstrap fields that pair them.

- The prefill is chosen by the prefill pool's policy (cache-aware by default: the prefill
  workers' KV events feed the mirror), the decode by the decode pool's (by load).
- Both are sent the client's body plus `bootstrap_host` (the prefill URL's host),
  `bootstrap_port` (its `--prefill URL PORT`, else none: the decode's own default) and a random
  63-bit `bootstrap_room`, new for every attempt.
- The answer is the decode's; the prefill's is read whole in the background (a stream) or
  alongside (a JSON answer). A native /generate that asks for the prompt's logprobs gets the
  prefill's merged in (pd_logprobs.py); its stream then starts once the prefill's ended.
- A failure of either side before the first byte reached the client (transport error or a
  retryable status) is retried on another pair with a new room, with the same backoff and
  breakers as the plain proxy; after it the stream ends with an SSE error event.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
from collections.abc import AsyncIterator, Sequence
from typing import Any
from urllib.parse import urlsplit

from fastapi.responses import Response, StreamingResponse
from starlette.datastructures import Headers

from radixserve.protocol.http_edge import SSE_DONE, sse_error
from radixserve.router.config import RouterConfig
from radixserve.router.metrics import RouterMetrics
from radixserve.router.pd_logprobs import (
    last_event_fields,
    merge_json,
    merge_stream,
    wants_prompt_logprobs,
)
from radixserve.router.proxy import Proxy, no_worker_response
from radixserve.router.selector import Lease, Selector
from radixserve.router.upstream import Upstream, UpstreamError, UpstreamResponse

logger = logging.getLogger(__name__)


def bootstrap_body(
    body: dict[str, Any], prefill_url: str, port: int | None, room: int
) -> dict[str, Any]:
    """The body both sides get: the client's, with the pair's bootstrap fields."""
    host = urlsplit(prefill_url).hostname or prefill_url
    return {**body, "bootstrap_host": host, "bootstrap_port": port, "bootstrap_room": room}


class PDProxy:
    def __init__(  # noqa: PLR0913 - the two pools and what they share
        self,
        config: RouterConfig,
        upstream: Upstream,
        prefill: Proxy,
        decode: Proxy,
        metrics: RouterMetrics,
    ) -> None:
        self.config = config
        self.upstream = upstream
        self.prefill = prefill  # its selector, registry and helpers; the pair is sent from here
        self.decode = decode
        self.metrics = metrics
        self.background: set[asyncio.Task[None]] = set()

    async def forward(  # noqa: PLR0913 - Proxy.forward's signature
        self,
        route: str,
        raw: bytes,
        body: dict[str, Any],
        key: bytes | None,
        headers: Headers,
    ) -> Response:
        tried_p: set[str] = set()
        tried_d: set[str] = set()
        last: Response | None = None
        for attempt in range(self.config.retry_max_attempts):
            if attempt:
                self.metrics.retries.inc()
                await asyncio.sleep(self.prefill.backoff(attempt))
            lp = self._choose(self.prefill.selector, key, tried_p)
            ld = self._choose(self.decode.selector, key, tried_d)
            if lp is None or ld is None:
                for lease in (lp, ld):
                    if lease is not None:
                        lease.release()
                break
            tried_p.add(lp.worker.url)
            tried_d.add(ld.worker.url)
            result = await self._attempt(lp, ld, route, body, headers)
            if result is not None and not self.prefill.retryable(result):
                return result
            last = result or last
        return last if last is not None else no_worker_response()

    @staticmethod
    def _choose(selector: Selector, key: bytes | None, tried: set[str]) -> Lease | None:
        """Another worker than those tried if there is one, else any (a pool of one retries
        its only worker, with a new room); `key`: the prompt's ids as the trees' key."""
        encoded = key or b""
        return selector.choose_encoded(encoded, exclude=tried) or selector.choose_encoded(encoded)

    async def _attempt(  # noqa: PLR0913 - one try of forward's request
        self, lp: Lease, ld: Lease, route: str, body: dict[str, Any], headers: Headers
    ) -> Response | None:
        ports = self.config.prefill_bootstrap_ports  # static; discovered ones: the flag's
        port = ports.get(lp.worker.url, self.config.k8s_bootstrap_port)
        full = bootstrap_body(body, lp.worker.url, port, random.randrange(2**63))
        data = json.dumps(full, ensure_ascii=False, allow_nan=False).encode()
        sent = await asyncio.gather(
            self.upstream.post(lp.worker.url, route, data, self.prefill.headers_for(lp, headers)),
            self.upstream.post(ld.worker.url, route, data, self.decode.headers_for(ld, headers)),
            return_exceptions=True,
        )
        if any(isinstance(r, BaseException) for r in sent):
            await self._abandon(lp, ld, sent, route)
            return None
        presp, dresp = sent
        assert isinstance(presp, UpstreamResponse) and isinstance(dresp, UpstreamResponse)
        lp.worker.breaker.record(presp.status < 500)
        ld.worker.breaker.record(dresp.status < 500)
        if presp.status >= 400 or dresp.status >= 400:
            return await self._error(lp, ld, presp, dresp, route)
        merge = wants_prompt_logprobs(route, body)
        if not bool(body.get("stream")):
            return await self._both(lp, ld, presp, dresp, route, merge)
        if not merge:
            self._drain_later(lp, presp, route)
            return self._stream(ld, dresp, route, {})
        # the prompt's logprobs are in the prefill's stream, which ends once the prefill did
        return self._stream(ld, dresp, route, last_event_fields(await self._read(lp, presp, route)))

    async def _abandon(
        self, lp: Lease, ld: Lease, sent: Sequence[UpstreamResponse | BaseException], route: str
    ) -> None:
        """One side failed before answering: give both leases back (the other side's request
        is dropped with its connection, so that engine aborts it)."""
        unexpected: BaseException | None = None
        for side, lease, r in zip((self.prefill, self.decode), (lp, ld), sent, strict=True):
            if isinstance(r, UpstreamError):
                await side.failed(lease, route, r)
            elif isinstance(r, BaseException):
                lease.release()
                unexpected = r
            else:
                r.release()
                lease.release()
        if unexpected is not None:
            raise unexpected

    async def _read(self, lease: Lease, resp: UpstreamResponse, route: str) -> bytes | None:
        try:
            return await resp.read()
        except UpstreamError as exc:
            logger.info("PD answer broke url=%s error=%r", lease.worker.url, exc)
            return None
        finally:
            resp.release()
            lease.release()
            self.metrics.requests.labels(lease.worker.url, route, str(resp.status)).inc()

    async def _error(  # noqa: PLR0913
        self, lp: Lease, ld: Lease, presp: UpstreamResponse, dresp: UpstreamResponse, route: str
    ) -> Response:
        """One side refused: its answer (the prefill's first: it names the pair's problem)."""
        pbody, dbody = await asyncio.gather(
            self._read(lp, presp, route), self._read(ld, dresp, route)
        )
        use, content = (presp, pbody) if presp.status >= 400 else (dresp, dbody)
        media = use.header("content-type", "application/json")
        return Response(content or b"", status_code=use.status, media_type=media)

    async def _both(  # noqa: PLR0913
        self,
        lp: Lease,
        ld: Lease,
        presp: UpstreamResponse,
        dresp: UpstreamResponse,
        route: str,
        merge: bool,
    ) -> Response | None:
        """A JSON answer: the decode's (with the prefill's prompt logprobs where asked)."""
        pbody, dbody = await asyncio.gather(
            self._read(lp, presp, route), self._read(ld, dresp, route)
        )
        if dbody is None:
            return None  # before the first byte: retried
        if merge:
            dbody = merge_json(dbody, pbody)
        media = dresp.header("content-type", "application/json")
        return Response(dbody, status_code=dresp.status, media_type=media)

    def _drain_later(self, lease: Lease, resp: UpstreamResponse, route: str) -> None:
        task = asyncio.get_running_loop().create_task(self._drain(lease, resp, route))
        self.background.add(task)
        task.add_done_callback(self.background.discard)

    async def _drain(self, lease: Lease, resp: UpstreamResponse, route: str) -> None:
        await self._read(lease, resp, route)

    def _stream(
        self, lease: Lease, resp: UpstreamResponse, route: str, prompt_fields: dict[str, Any]
    ) -> StreamingResponse:
        """The decode's stream; `prompt_fields` (the prefill's prompt logprobs) go into each
        event's meta_info where there are any."""

        async def chunks() -> AsyncIterator[bytes]:
            outcome = "200"
            body = resp.stream()
            try:
                merged = merge_stream(body, prompt_fields) if prompt_fields else body
                async for chunk in merged:
                    yield chunk
            except UpstreamError as exc:
                outcome = "stream_error"
                lease.worker.breaker.record(False)
                yield sse_error(f"decode worker {lease.worker.url} failed mid-stream: {exc}", 502)
                yield SSE_DONE
            finally:
                resp.release()
                lease.release()
                self.metrics.requests.labels(lease.worker.url, route, outcome).inc()

        media = resp.header("content-type", "text/event-stream")
        return StreamingResponse(chunks(), status_code=resp.status, media_type=media)
