"""The data plane's client to the workers: keep-alive HTTP/1.1 connections whose answers
httptools parses (C), with nothing else on the way.

Every proxied request crosses it, so it does only what the proxy needs: one POST, the status
and headers, then the body whole or as it arrives. Measured on `bench router-overhead`'s
load, a request costs ~8 µs of CPU here, ~65 µs through aiohttp's client and 500 µs (one in
flight) to 1,900 µs (32 in flight, its pool scans every connection per request) through httpx,
which stays the control plane's client (health checks, load polls, probes, the admin API).

What it keeps from the httpx client it replaces:
- at most 1,024 requests in flight (a request waits for a slot at most `request_timeout_s`);
  idle connections are reused newest first, at most 256 per worker, and dropped after 4 s, before
  the engine's server (uvicorn: 5 s) closes them under a request;
- connecting within `connect_timeout_s`; every wait for the worker's bytes (the headers, each
  piece of the body) within `request_timeout_s` of the last bytes;
- TLS to an `https://` worker (the system's CAs), and a proxy from the environment
  (`HTTP_PROXY`, `HTTPS_PROXY`, `ALL_PROXY`, `NO_PROXY`; an `http://` proxy: the request in
  absolute form, or a CONNECT tunnel to an `https://` worker), looked up once per worker;
- a stream's bytes are read as the consumer takes them: past 64 KiB unread, reading pauses.
Errors are `UpstreamError`: `ConnectFailed` when nothing accepted the connection (the worker is
down: act now), `UpstreamTimeout`, or the connection lost or the answer malformed.
"""

from __future__ import annotations

import asyncio
import base64
import ssl
from collections import deque
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit
from urllib.request import (  # type: ignore[attr-defined]  # in the module, not in typeshed
    getproxies_environment,
    proxy_bypass_environment,
)

import httptools

from radixserve.router.config import RouterConfig

MAX_IN_FLIGHT = 1024
MAX_IDLE_PER_WORKER = 256
KEEPALIVE_S = 4.0
PAUSE_BYTES = 64 * 1024  # unread body bytes held before the socket stops being read


class UpstreamError(Exception):
    """The worker's answer did not come whole (a transport failure, not an HTTP status)."""


class ConnectFailed(UpstreamError):
    """Nothing accepted the connection: refused, unreachable, unresolvable, TLS refused."""


class UpstreamTimeout(UpstreamError):
    pass


@dataclass(frozen=True)
class Target:
    """Where a worker's requests go: its origin, and the proxy in front of it (if any)."""

    scheme: str
    host: str
    port: int
    authority: bytes  # the Host header: host[:port] as the URL spells it
    proxy: tuple[str, int, bytes | None] | None = None  # host, port, Proxy-Authorization

    @classmethod
    def of(cls, url: str) -> Target:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise UpstreamError(f"worker URL {url!r}: expected http:// or https://host:port")
        port = parts.port or (443 if parts.scheme == "https" else 80)
        authority = parts.netloc.rpartition("@")[2].encode("idna")
        return cls(parts.scheme, parts.hostname, port, authority, _env_proxy(parts.scheme, parts))


def _env_proxy(scheme: str, parts: object) -> tuple[str, int, bytes | None] | None:
    proxies = getproxies_environment()
    url = proxies.get(scheme) or proxies.get("all")
    host = getattr(parts, "hostname", "") or ""
    if not url or proxy_bypass_environment(host, proxies):
        return None
    proxy = urlsplit(url if "://" in url else "http://" + url)
    if proxy.scheme != "http" or not proxy.hostname:
        raise UpstreamError(f"proxy {url!r}: only http:// proxies are supported")
    login = None
    if proxy.username is not None:
        pair = f"{unquote(proxy.username)}:{unquote(proxy.password or '')}"
        login = b"Basic " + base64.b64encode(pair.encode("latin-1"))
    return proxy.hostname, proxy.port or 80, login


class _Connection(asyncio.Protocol):
    """One keep-alive connection; one answer at a time, read through `wait`."""

    def __init__(self, loop: asyncio.AbstractEventLoop, read_timeout: float) -> None:
        self.loop = loop
        self.read_timeout = read_timeout
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.idle_since = 0.0
        self.begin()

    def begin(self) -> None:
        """Ready for the next answer."""
        self.parser = httptools.HttpResponseParser(self)
        self.status = 0
        self.headers: dict[bytes, bytes] = {}
        self.chunks: deque[bytes] = deque()
        self.buffered = 0
        self.headers_done = self.done = self.paused = False
        self.error: UpstreamError | None = None
        self.waiter: asyncio.Future[None] | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.last = self.loop.time()

    # ---- asyncio ---------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # a stream transport

    def data_received(self, data: bytes) -> None:
        self.last = self.loop.time()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(UpstreamError(f"malformed answer from the worker: {exc}"))
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.headers_done and not self.done and not self._framed():
            self.done = True  # a body that ends with the connection
            self._wake()
        elif not self.done:
            self._fail(UpstreamError(f"the worker closed the connection ({exc or 'EOF'})"))

    # ---- httptools ---------------------------------------------------------------------------

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers[name.lower()] = value

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()
        self.headers_done = True
        self._wake()

    def on_body(self, body: bytes) -> None:
        self.chunks.append(body)
        self.buffered += len(body)
        if self.buffered > PAUSE_BYTES and not self.paused and self.transport is not None:
            self.paused = True
            self.transport.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        self.done = True
        if not self.parser.should_keep_alive():
            self.close()
        self._wake()

    # ---- the reader's side -------------------------------------------------------------------

    def _framed(self) -> bool:
        return b"content-length" in self.headers or b"transfer-encoding" in self.headers

    def _wake(self) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    def _fail(self, exc: UpstreamError) -> None:
        if self.error is None:
            self.error = exc
        self._wake()

    async def wait(self) -> None:
        """Until more of the answer came (or it failed); UpstreamTimeout after `read_timeout`
        without a byte."""
        if self.error is not None:
            raise self.error
        self.waiter = self.loop.create_future()
        self.timer = self.loop.call_at(self.last + self.read_timeout, self._on_timer)
        try:
            await self.waiter
        finally:
            self.waiter = None
            self.timer.cancel()
        if self.error is not None:
            raise self.error

    def _on_timer(self) -> None:
        idle = self.loop.time() - self.last
        if idle < self.read_timeout:  # bytes came meanwhile
            self.timer = self.loop.call_at(self.last + self.read_timeout, self._on_timer)
            return
        self._fail(UpstreamTimeout(f"no answer from the worker for {idle:.1f}s"))
        self.close()

    def take(self) -> bytes:
        """The body bytes that came so far (reading resumes if it paused)."""
        data = self.chunks[0] if len(self.chunks) == 1 else b"".join(self.chunks)
        self.chunks.clear()
        self.buffered = 0
        if self.paused and self.transport is not None and not self.closed:
            self.paused = False
            self.transport.resume_reading()
        return data

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()
        self.closed = True


class UpstreamResponse:
    """A worker's answer: status and headers now, the body by `read` or `stream`. `release`
    exactly once: the connection goes back to the pool when the answer came whole, else it is
    closed (the engine sees the client leave and aborts the request)."""

    def __init__(self, upstream: Upstream, key: Target, conn: _Connection) -> None:
        self._upstream = upstream
        self._key = key
        self._conn = conn
        self.status = conn.status
        self.headers = conn.headers

    def header(self, name: str, default: str) -> str:
        value = self.headers.get(name.encode())
        return default if value is None else value.decode("latin-1")

    async def read(self) -> bytes:
        conn = self._conn
        while not conn.done:
            await conn.wait()
        return conn.take()

    async def stream(self) -> AsyncIterator[bytes]:
        conn = self._conn
        while True:
            if conn.chunks:
                yield conn.take()
            elif conn.done:
                return
            else:
                await conn.wait()

    def release(self) -> None:
        self._upstream.give_back(self._key, self._conn)


class Upstream:
    def __init__(self, config: RouterConfig) -> None:
        self.connect_timeout = config.connect_timeout_s
        self.read_timeout = config.request_timeout_s
        self._slots = asyncio.Semaphore(MAX_IN_FLIGHT)
        self._idle: dict[Target, list[_Connection]] = {}
        self._targets: dict[str, Target] = {}
        self._tls: ssl.SSLContext | None = None

    async def post(
        self, url: str, path: str, body: bytes, headers: Mapping[str, str]
    ) -> UpstreamResponse:
        """Send one POST to the worker at `url`; returns once the answer's headers came."""
        key = self._targets.get(url) or self._targets.setdefault(url, Target.of(url))
        head = _request_head(key, path, len(body), headers)
        if self._slots.locked():
            try:
                await asyncio.wait_for(self._slots.acquire(), self.read_timeout)
            except asyncio.TimeoutError:
                raise UpstreamTimeout(f"no free connection for {self.read_timeout}s") from None
        else:
            await self._slots.acquire()
        conn = None
        try:
            conn = self._reuse(key) or await self._open(key)
            assert conn.transport is not None
            conn.transport.write(head + body)
            while not conn.headers_done:
                await conn.wait()
        except BaseException:
            if conn is not None:
                conn.close()
            self._slots.release()
            raise
        return UpstreamResponse(self, key, conn)

    def give_back(self, key: Target, conn: _Connection) -> None:
        self._slots.release()
        if not conn.done or conn.error is not None or conn.closed:
            conn.close()
            return
        idle = self._idle.setdefault(key, [])
        conn.idle_since = conn.loop.time()
        idle.append(conn)
        if len(idle) > MAX_IDLE_PER_WORKER:
            idle.pop(0).close()

    def _reuse(self, key: Target) -> _Connection | None:
        idle = self._idle.get(key)
        while idle:
            conn = idle.pop()
            if not conn.closed and conn.loop.time() - conn.idle_since < KEEPALIVE_S:
                conn.begin()
                return conn
            conn.close()
        return None

    async def _open(self, key: Target) -> _Connection:
        loop = asyncio.get_running_loop()
        host, port = (key.proxy[0], key.proxy[1]) if key.proxy else (key.host, key.port)
        tls = self._tls_context() if key.scheme == "https" else None
        direct_tls = tls if key.proxy is None else None
        try:
            _, conn = await asyncio.wait_for(
                loop.create_connection(
                    lambda: _Connection(loop, self.read_timeout),
                    host,
                    port,
                    ssl=direct_tls,
                    server_hostname=key.host if direct_tls else None,
                ),
                self.connect_timeout,
            )
            if tls is not None and key.proxy is not None:
                try:
                    await _tunnel(conn, key, tls)
                except BaseException:
                    conn.close()
                    raise
        except asyncio.TimeoutError:
            raise UpstreamTimeout(
                f"connecting to {host}:{port} took over {self.connect_timeout}s"
            ) from None
        except OSError as exc:  # refused, unreachable, unresolvable (gaierror), TLS (SSLError)
            raise ConnectFailed(f"connecting to {host}:{port}: {exc}") from exc
        return conn

    def _tls_context(self) -> ssl.SSLContext:
        if self._tls is None:
            self._tls = ssl.create_default_context()
        return self._tls

    async def aclose(self) -> None:
        for idle in self._idle.values():
            for conn in idle:
                conn.close()
        self._idle.clear()


def _request_head(key: Target, path: str, length: int, headers: Mapping[str, str]) -> bytes:
    target = path.encode()
    lines = [b"POST ", target, b" HTTP/1.1\r\nhost: ", key.authority, b"\r\n"]
    if key.proxy is not None and key.scheme == "http":  # absolute form, to the proxy
        lines[1] = b"http://" + key.authority + target
        if key.proxy[2] is not None:
            lines += [b"proxy-authorization: ", key.proxy[2], b"\r\n"]
    for name, value in headers.items():
        if "\r" in value or "\n" in value:
            raise UpstreamError(f"header {name}: a line break in its value")
        lines += [name.encode("latin-1"), b": ", value.encode("latin-1"), b"\r\n"]
    lines.append(b"content-length: %d\r\n\r\n" % length)
    return b"".join(lines)


async def _tunnel(conn: _Connection, key: Target, tls: ssl.SSLContext) -> None:
    """CONNECT through the proxy, then TLS to the worker inside the tunnel."""
    assert conn.transport is not None and key.proxy is not None
    head = b"CONNECT %s:%d HTTP/1.1\r\nhost: %s:%d\r\n" % (
        key.host.encode("idna"),
        key.port,
        key.host.encode("idna"),
        key.port,
    )
    if key.proxy[2] is not None:
        head += b"proxy-authorization: " + key.proxy[2] + b"\r\n"
    conn.transport.write(head + b"\r\n")
    while not conn.headers_done:
        await conn.wait()
    if conn.status != 200:
        raise UpstreamError(f"the proxy refused CONNECT {key.host}:{key.port}: {conn.status}")
    loop = asyncio.get_running_loop()
    transport = await loop.start_tls(conn.transport, conn, tls, server_hostname=key.host)
    if transport is None:
        raise ConnectFailed(f"TLS to {key.host}:{key.port} through the proxy failed")
    conn.transport = transport
    conn.begin()
