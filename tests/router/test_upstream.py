"""The router's client to its workers (router/upstream.py) against real sockets: a worker double
that writes scripted bytes (so each framing and each failure is exactly what a test says), a
forward proxy double that relays bytes, and TLS with a certificate made by the openssl command.

Framing: Content-Length, chunked (each piece reaches the reader as the worker writes it), a body
that ends with the connection; keep-alive reuse, a worker closing an idle connection, a reader
that stops early (the worker sees the connection close: the engine aborts). Failures: refused
(ConnectFailed), closed before the answer, malformed, silent past the read timeout. Flow: an
unread stream stops being read at 64 KiB. Proxies from the environment, and TLS."""

from __future__ import annotations

import asyncio
import os
import shutil
import ssl
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeAlias

import pytest

from radixserve.router.config import RouterConfig
from radixserve.router.upstream import (
    PAUSE_BYTES,
    ConnectFailed,
    Upstream,
    UpstreamError,
    UpstreamTimeout,
)
from tests.child_env import child_env
from tests.ports import bind_retrying, free_port, listening_socket

OK = b'HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 11\r\n\r\n{"a": true}'
Reader: TypeAlias = asyncio.StreamReader
Writer: TypeAlias = asyncio.StreamWriter
Script = Callable[[Reader, Writer, "Worker"], Awaitable[None]]


@dataclass
class Worker:
    """A TCP server that runs `script` on every connection; counts connections and requests."""

    url: str = ""
    connections: int = 0
    heads: list[bytes] = field(default_factory=list)
    closed_by_client: asyncio.Event = field(default_factory=asyncio.Event)

    async def request(self, reader: asyncio.StreamReader) -> bytes:
        head = await reader.readuntil(b"\r\n\r\n")
        self.heads.append(head)
        length = next(
            int(line.split(b":")[1]) for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length")
        )  # fmt: skip
        return await reader.readexactly(length)


@asynccontextmanager
async def worker(script: Script, tls: ssl.SSLContext | None = None) -> AsyncIterator[Worker]:
    w = Worker()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        w.connections += 1
        try:
            await script(reader, writer, w)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    sock = bind_retrying(listening_socket)
    server = await asyncio.start_server(serve, sock=sock, ssl=tls)
    w.url = f"{'https' if tls else 'http'}://{'localhost' if tls else '127.0.0.1'}:"
    w.url += str(sock.getsockname()[1])
    async with server:
        yield w


def upstream(read_timeout: float = 10.0) -> Upstream:
    return Upstream(RouterConfig(request_timeout_s=read_timeout, connect_timeout_s=5.0))


async def answer_ok(reader: Reader, writer: Writer, w: Worker) -> None:
    while True:
        await w.request(reader)
        writer.write(OK)


def run(coro: Awaitable[None]) -> None:
    asyncio.run(asyncio.wait_for(coro, 30))


# ---- framing and keep-alive ---------------------------------------------------------------------


def test_answers_are_read_whole_and_the_connection_is_kept() -> None:
    async def scenario() -> None:
        up = upstream()
        async with worker(answer_ok) as w:
            for _ in range(3):
                resp = await up.post(w.url, "/generate", b'{"x": 1}', {"x-request-id": "r"})
                assert (resp.status, resp.header("content-type", "")) == (200, "application/json")
                assert await resp.read() == b'{"a": true}'
                resp.release()
        assert w.connections == 1
        head = w.heads[0].decode()
        assert head.startswith("POST /generate HTTP/1.1\r\n") and "x-request-id: r\r\n" in head
        await up.aclose()

    run(scenario())


def test_a_chunked_stream_arrives_as_the_worker_writes_it() -> None:
    more = asyncio.Event()

    async def script(reader: Reader, writer: Writer, w: Worker) -> None:
        await w.request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n6\r\ndata 1\r\n")
        await more.wait()
        writer.write(b"6\r\ndata 2\r\n0\r\n\r\n")
        await reader.read()  # until the client closes

    async def scenario() -> None:
        up = upstream()
        async with worker(script) as w:
            resp = await up.post(w.url, "/generate", b"{}", {})
            pieces = []
            async for piece in resp.stream():
                pieces.append(piece)
                more.set()  # the second piece is written only after the first was read
            resp.release()
            assert pieces == [b"data 1", b"data 2"]

    run(scenario())


def test_a_body_that_ends_with_the_connection() -> None:
    async def script(reader: Reader, writer: Writer, w: Worker) -> None:
        await w.request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\nall of it")

    async def scenario() -> None:
        up = upstream()
        async with worker(script) as w:
            resp = await up.post(w.url, "/generate", b"{}", {})
            assert await resp.read() == b"all of it"
            resp.release()
            resp = await up.post(w.url, "/generate", b"{}", {})  # a new connection
            assert await resp.read() == b"all of it"
            assert w.connections == 2

    run(scenario())


def test_an_idle_connection_the_worker_closed_is_not_reused() -> None:
    async def script(reader: Reader, writer: Writer, w: Worker) -> None:
        await w.request(reader)
        writer.write(OK)
        await writer.drain()  # then close: uvicorn's keep-alive timeout, early

    async def scenario() -> None:
        up = upstream()
        async with worker(script) as w:
            for _ in range(2):
                resp = await up.post(w.url, "/generate", b"{}", {})
                assert await resp.read() == b'{"a": true}'
                resp.release()
                await asyncio.sleep(0.2)  # the close reaches the client
            assert w.connections == 2

    run(scenario())


def test_a_reader_that_stops_early_closes_the_connection() -> None:
    async def script(reader: Reader, writer: Writer, w: Worker) -> None:
        await w.request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nfirst\r\n")
        assert await reader.read() == b""  # EOF: what makes the engine abort the request
        w.closed_by_client.set()

    async def scenario() -> None:
        up = upstream()
        async with worker(script) as w:
            resp = await up.post(w.url, "/generate", b"{}", {})
            async for _ in resp.stream():
                break
            resp.release()
            await asyncio.wait_for(w.closed_by_client.wait(), 5)

    run(scenario())


# ---- failures -----------------------------------------------------------------------------------


def test_a_refused_connection_is_connect_failed() -> None:
    async def scenario() -> None:
        with pytest.raises(ConnectFailed):
            await upstream().post(f"http://127.0.0.1:{free_port()}", "/generate", b"{}", {})

    run(scenario())


@pytest.mark.parametrize(
    "reply",
    [b"", b"HTTP/1.1 200 OK\r\ncontent-length: 50\r\n\r\nshort", b"NOT HTTP AT ALL\r\n\r\n"],
    ids=["closed-before-answer", "closed-mid-body", "malformed"],
)
def test_an_answer_that_does_not_come_whole_is_an_upstream_error(reply: bytes) -> None:
    async def script(reader: Reader, writer: Writer, w: Worker) -> None:
        await w.request(reader)
        writer.write(reply)

    async def scenario() -> None:
        async with worker(script) as w:
            with pytest.raises(UpstreamError) as err:
                resp = await upstream().post(w.url, "/generate", b"{}", {})
                await resp.read()
            assert not isinstance(err.value, ConnectFailed)

    run(scenario())


def test_a_silent_worker_times_out_before_and_during_the_answer() -> None:
    async def silent(reader: Reader, writer: Writer, w: Worker) -> None:
        await w.request(reader)
        if len(w.heads) == 2:  # the second request: headers and a piece, then silence
            writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n1\r\nx\r\n")
        await asyncio.sleep(10)

    async def scenario() -> None:
        up = upstream(read_timeout=0.3)
        async with worker(silent) as w:
            with pytest.raises(UpstreamTimeout):
                await up.post(w.url, "/generate", b"{}", {})
            resp = await up.post(w.url, "/generate", b"{}", {})
            with pytest.raises(UpstreamTimeout):
                async for _ in resp.stream():
                    pass
            resp.release()

    run(scenario())


def test_the_read_timeout_counts_from_the_last_bytes() -> None:
    async def trickle(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, w: Worker
    ) -> None:
        await w.request(reader)
        for part in (b"HTTP/1.1 200 OK\r\n", b"content-length: 2\r\n", b"\r\nok"):
            writer.write(part)  # no part completes the headers until the last
            await asyncio.sleep(0.2)

    async def scenario() -> None:
        async with worker(trickle) as w:
            resp = await upstream(read_timeout=0.3).post(w.url, "/generate", b"{}", {})
            assert await resp.read() == b"ok"  # 0.4 s in all, never 0.3 s without a byte

    run(scenario())


# ---- flow control -------------------------------------------------------------------------------


def test_an_unread_stream_stops_being_read() -> None:
    piece = b"x" * 16384
    written = 0

    async def flood(reader: Reader, writer: Writer, w: Worker) -> None:
        nonlocal written
        await w.request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        for _ in range(2000):  # 32 MB, far more than the socket buffers hold
            writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            written += len(piece)
            await writer.drain()

    async def scenario() -> None:
        async with worker(flood) as w:
            resp = await upstream().post(w.url, "/generate", b"{}", {})
            await asyncio.sleep(1.0)  # nobody reads
            held = resp._conn.buffered
            assert held <= PAUSE_BYTES + 256 * 1024, held  # one socket read past the mark
            assert written < 16 * 1024 * 1024, written  # the worker was held back too
            resp.release()

    run(scenario())


# ---- proxies and TLS ----------------------------------------------------------------------------


async def relay(a: asyncio.StreamReader, b: asyncio.StreamWriter) -> None:
    try:
        while data := await a.read(65536):
            b.write(data)
            await b.drain()
    except ConnectionError:
        pass
    finally:
        b.close()


@asynccontextmanager
async def forward_proxy(seen: list[bytes]) -> AsyncIterator[str]:
    """An HTTP proxy: absolute-form requests are relayed to their host, CONNECT is a tunnel."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        seen.append(head)
        method, target, _ = head.split(b" ", 2)
        if method == b"CONNECT":
            host, port = target.rsplit(b":", 1)
            up_r, up_w = await asyncio.open_connection(host.decode(), int(port))
            writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        else:
            authority, _, path = target.removeprefix(b"http://").partition(b"/")
            host, port = authority.rsplit(b":", 1)
            up_r, up_w = await asyncio.open_connection(host.decode(), int(port))
            up_w.write(head.replace(target, b"/" + path, 1))
        await asyncio.gather(relay(reader, up_w), relay(up_r, writer))

    sock = bind_retrying(listening_socket)
    server = await asyncio.start_server(serve, sock=sock)
    async with server:
        yield f"http://user:pw@127.0.0.1:{sock.getsockname()[1]}"


@pytest.fixture
def proxy_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in ("no_proxy", "NO_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_an_http_proxy_from_the_environment_gets_absolute_form(
    proxy_env: pytest.MonkeyPatch,
) -> None:
    async def scenario() -> None:
        seen: list[bytes] = []
        async with worker(answer_ok) as w, forward_proxy(seen) as proxy:
            proxy_env.setenv("HTTP_PROXY", proxy)
            resp = await upstream().post(w.url, "/generate", b"{}", {})
            assert await resp.read() == b'{"a": true}'
            resp.release()
            proxy_env.setenv("NO_PROXY", "127.0.0.1")
            resp = await upstream().post(w.url, "/generate", b"{}", {})  # straight there
            resp.release()
        assert len(seen) == 1 and seen[0].startswith(f"POST {w.url}/generate ".encode())
        assert b"proxy-authorization: Basic dXNlcjpwdw==\r\n" in seen[0]

    run(scenario())


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    if shutil.which("openssl") is None:
        pytest.skip("no openssl command to make a certificate")
    folder = tmp_path_factory.mktemp("tls")
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost",
         "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True, env=child_env(),
    )  # fmt: skip
    return cert, key


def test_https_workers_directly_and_through_a_connect_tunnel(
    tls_files: tuple[Path, Path], proxy_env: pytest.MonkeyPatch
) -> None:
    cert, key = tls_files
    server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_tls.load_cert_chain(cert, key)
    proxy_env.setenv("SSL_CERT_FILE", str(cert))  # the client trusts it as a CA

    async def scenario() -> None:
        seen: list[bytes] = []
        async with worker(answer_ok, tls=server_tls) as w, forward_proxy(seen) as proxy:
            proxy_env.delenv("HTTPS_PROXY", raising=False)
            resp = await upstream().post(w.url, "/generate", b"{}", {})
            assert await resp.read() == b'{"a": true}'
            resp.release()
            proxy_env.setenv("HTTPS_PROXY", proxy)
            resp = await upstream().post(w.url, "/generate", b"{}", {})
            assert await resp.read() == b'{"a": true}'
            resp.release()
        port = w.url.rsplit(":", 1)[1]
        assert len(seen) == 1 and seen[0].startswith(f"CONNECT localhost:{port} ".encode())
        assert os.environ["SSL_CERT_FILE"] == str(cert)

    run(scenario())
