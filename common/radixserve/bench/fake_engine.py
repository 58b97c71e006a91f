"""A fast fake engine for `bench router-overhead`: a real HTTP/1.1 server in its own process
that answers what routers ask an SGLang-style engine with bodies captured from a live
radixserve engine (`router_capture.Capture`), so a router's own cost is what a benchmark sees.

- GET `/health`, `/server_info` (without `kv_events`: no publisher here, the routers keep
  approximate trees of what they routed), `/model_info`, `/get_load`, `/get_server_info`,
  `/get_model_info`, `/v1/models`, `/get_tokenizer`: the captured answers.
- POST `/v1/chat/completions`, `/v1/completions`, `/generate`: the captured chat answer, or
  with `"stream": true` the captured SSE events, one chunk each (chunked transfer encoding),
  `--token-interval-ms` apart so a router sees them as an engine writes them.
Anything else is a 404. Keep-alive, no pipelining (no router pipelines), Content-Length bodies
only. Plain asyncio (uvloop when installed): the fake must cost far less than what it serves.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
from typing import Any

from radixserve.bench.router_capture import Capture, load_capture

HEAD_END = b"\r\n\r\n"
POST_PATHS = frozenset({b"/v1/chat/completions", b"/v1/completions", b"/generate"})


def _response(status: int, content_type: str, body: bytes) -> bytes:
    reason = {200: "OK", 404: "Not Found", 411: "Length Required"}.get(status, "Error")
    head = (
        f"HTTP/1.1 {status} {reason}\r\ncontent-type: {content_type}\r\n"
        f"content-length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


class Answers:
    """Every answer as the bytes written to the socket, built once from the capture."""

    def __init__(self, capture: Capture, token_interval_s: float) -> None:
        info = {k: v for k, v in capture.server_info.items() if k != "kv_events"}
        as_json = lambda value: _response(200, "application/json", json.dumps(value).encode())  # noqa: E731
        self.get: dict[bytes, bytes] = {
            b"/health": _response(200, "text/plain", b""),
            b"/server_info": as_json(info),
            b"/get_server_info": as_json(info),
            b"/model_info": as_json(capture.model_info),
            b"/get_model_info": as_json(capture.model_info),
            b"/get_load": as_json(capture.load),
            b"/v1/models": as_json(capture.models),
            b"/get_tokenizer": _response(200, "application/json", capture.tokenizer.encode()),
        }
        self.chat = _response(200, "application/json", capture.chat.encode())
        self.stream_head = (
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\n"
            b"transfer-encoding: chunked\r\n\r\n"
        )
        self.stream_chunks = [
            f"{len(e.encode()):x}\r\n".encode() + e.encode() + b"\r\n" for e in capture.stream
        ]
        self.token_interval_s = token_interval_s
        self.not_found = _response(404, "application/json", b'{"detail":"Not Found"}')
        self.length_required = _response(411, "text/plain", b"")


class FakeEngineProtocol(asyncio.Protocol):
    def __init__(self, answers: Answers) -> None:
        self.answers = answers
        self.buffer = bytearray()
        self.busy = False  # a stream is being written: later bytes wait in the buffer
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # a TCP server's is one

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        if not self.busy:
            self._serve()

    def _serve(self) -> None:
        while self.transport is not None and not self.transport.is_closing():
            request = self._next_request()
            if request is None:
                return
            method, path, body = request
            if method == b"POST" and path in POST_PATHS:
                if _wants_stream(body):
                    self.busy = True
                    asyncio.get_running_loop().create_task(self._stream())
                    return
                self.transport.write(self.answers.chat)
            elif method == b"GET":
                self.transport.write(self.answers.get.get(path, self.answers.not_found))
            else:
                self.transport.write(self.answers.not_found)

    def _next_request(self) -> tuple[bytes, bytes, bytes] | None:
        end = self.buffer.find(HEAD_END)
        if end < 0:
            return None
        lines = bytes(self.buffer[:end]).split(b"\r\n")
        method, target, _ = lines[0].split(b" ", 2)
        length = 0
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                length = int(value)
            elif name == b"transfer-encoding" and self.transport is not None:
                self.transport.write(self.answers.length_required)
                self.transport.close()
                return None
        start = end + len(HEAD_END)
        if len(self.buffer) < start + length:
            return None
        body = bytes(self.buffer[start : start + length])
        del self.buffer[: start + length]
        return method, target.split(b"?", 1)[0], body

    async def _stream(self) -> None:
        transport, answers = self.transport, self.answers
        assert transport is not None
        transport.write(answers.stream_head)
        for chunk in answers.stream_chunks:
            if answers.token_interval_s:
                await asyncio.sleep(answers.token_interval_s)
            if transport.is_closing():  # the router went away (a client disconnect)
                return
            transport.write(chunk)
        transport.write(b"0\r\n\r\n")
        self.busy = False
        self._serve()

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None


def _wants_stream(body: bytes) -> bool:
    if b'"stream"' not in body:
        return False
    try:
        parsed: Any = json.loads(body)
    except ValueError:
        return False
    return isinstance(parsed, dict) and parsed.get("stream") is True


async def serve(host: str, port: int, answers: Answers) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: FakeEngineProtocol(answers), host, port, backlog=4096)
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    print(f"fake engine serving on http://{host}:{port}", flush=True)
    async with server:
        await stop.wait()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--capture-file", required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--token-interval-ms", type=float, default=1.0)
    args = p.parse_args(argv)
    answers = Answers(load_capture(args.capture_file), args.token_interval_ms / 1000)
    try:
        import uvloop  # type: ignore[import-not-found,unused-ignore]  # optional: faster loop

        runner: Any = uvloop.run
    except ImportError:
        runner = asyncio.run
    runner(serve(args.host, args.port, answers))


if __name__ == "__main__":
    main()
