"""The prefill's bootstrap server (SGLang's routes) and the decode's client of it.

The server runs on a thread of the prefill's first scheduler rank, on
`--disaggregation-bootstrap-port`. That rank registers the control endpoints and the topology
in process; it speaks for its TP peers (their KV buffers reach it over the side's CPU group).
A decode fetches them (`GET /route`: 503 until registered) before it sends anything, and polls
`GET /health` while it waits on that prefill. Both answers carry the server's session id, new
at every start: a prefill that restarted at the same address (a container restarted in its
pod) has new control endpoints, and the decode must look them up again.
"""

from __future__ import annotations

import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import msgspec

from radixserve.engine.disaggregation.wire import PrefillInfo, RankInfo, Topology


class Registration(msgspec.Struct, frozen=True):
    """The hosting rank's registration: its rank and the prefill's topology."""

    rank: RankInfo
    topology: Topology


class _Table:
    def __init__(self) -> None:
        self.session = uuid.uuid4().hex
        self.lock = threading.Lock()
        self.topology: Topology | None = None
        self.ranks: dict[int, RankInfo] = {}

    def register(self, reg: Registration) -> None:
        with self.lock:
            self.topology = reg.topology
            self.ranks[reg.rank.tp_rank] = reg.rank

    def info(self) -> PrefillInfo | None:
        with self.lock:
            if self.topology is None or not self.ranks:
                return None
            ranks = [self.ranks[r] for r in sorted(self.ranks)]
            return PrefillInfo(self.topology, ranks, self.session)


def _handler(table: _Table) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def _reply(self, status: int, body: bytes = b"") -> None:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            path = self.path.split("?", 1)[0]
            if path == "/health":
                self._reply(200, msgspec.json.encode({"session": table.session}))
            elif path == "/route":
                info = table.info()
                if info is None:
                    self._reply(503, b'{"error": "the prefill has not registered yet"}')
                else:
                    self._reply(200, msgspec.json.encode(info))
            else:
                self._reply(404)

        def log_message(self, format: str, *args: Any) -> None:
            return None  # one line per poll would drown the log

    return Handler


class BootstrapServer:
    """Serves on its own daemon thread until `close`."""

    def __init__(self, host: str, port: int) -> None:
        self.table = _Table()
        self._server = ThreadingHTTPServer((host, port), _handler(self.table))
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="pd-bootstrap", daemon=True
        )
        self._thread.start()

    def register(self, reg: Registration) -> None:
        """The hosting rank's own registration (no HTTP round trip)."""
        self.table.register(reg)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def fetch_prefill_info(address: str, timeout_s: float = 5.0) -> PrefillInfo:
    """GET /route; raises httpx errors (connection refused, 503 while ranks register)."""
    r = httpx.get(f"http://{address}/route", timeout=timeout_s)
    r.raise_for_status()
    return msgspec.json.decode(r.content, type=PrefillInfo)


def health_session(address: str, timeout_s: float = 2.0) -> str | None:
    """The session GET /health names ("" from a server that names none); None: no answer."""
    try:
        r = httpx.get(f"http://{address}/health", timeout=timeout_s)
    except httpx.HTTPError:
        return None
    if r.status_code != 200:
        return None
    try:
        session = r.json().get("session", "")
    except (ValueError, AttributeError):
        return ""
    return session if isinstance(session, str) else ""
