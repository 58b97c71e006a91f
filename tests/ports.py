"""The test suite's one source of TCP ports for servers it starts on 127.0.0.1, and the retry
around a bind that lost its port anyway. No other test module picks ports (the architecture
test `test_no_private_port_pickers` holds every file to that).

Why not "bind port 0, read the port, close": the kernel answers port 0 from its ephemeral
range, the same range it takes outgoing connections' source ports from. Between choosing and
the server's bind (seconds, for a replica that loads its model first) any connect() on the
machine may take the port, and the same process may be offered it again. So ports here:
- lie outside the ephemeral range (/proc/sys/net/ipv4/ip_local_port_range), where the kernel
  never hands out a port by itself: only another explicit chooser can collide;
- are never handed out twice in one process, and each process starts at a random point, so
  two test processes walk different parts of the space;
- are probed by a bind on every address before they are handed out.
Another process may still bind a port after the probe; `bind_retrying` (in-process binds) and
`lost_its_port` (a child's start-up log) turn that into a retry with fresh ports.
"""

from __future__ import annotations

import errno
import random
import socket
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")

EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
DEFAULT_EPHEMERAL = (32768, 60999)  # Linux's default, for machines without the file
LOWEST_PORT = 10000  # below: well-known and registered services (5432, 6379, 8080, ...)
BIND_ATTEMPTS = 8


def ephemeral_range(path: Path = EPHEMERAL_RANGE_FILE) -> tuple[int, int]:
    """(first, last) port the kernel picks for port-0 binds and outgoing connections."""
    try:
        first, last = (int(x) for x in path.read_text().split())
    except (OSError, ValueError):
        return DEFAULT_EPHEMERAL
    return first, last


def candidate_ranges(ephemeral: tuple[int, int]) -> list[range]:
    """Ports at or above LOWEST_PORT outside `ephemeral`; the whole span above LOWEST_PORT if
    the ephemeral range leaves too little room (a machine that made almost every port
    ephemeral still gets ports, only without this protection)."""
    first, last = ephemeral
    ranges = [range(LOWEST_PORT, min(first, 65536)), range(max(last + 1, LOWEST_PORT), 65536)]
    ranges = [r for r in ranges if len(r) > 0]
    return ranges if sum(len(r) for r in ranges) >= 1000 else [range(LOWEST_PORT, 65536)]


def is_bindable(port: int) -> bool:
    """Whether nothing holds `port` on any IPv4 address (a probe; it is released at once)."""
    with socket.socket() as s:
        try:
            s.bind(("", port))
        except OSError:
            return False
    return True


class PortPool:
    """Hands out runs of consecutive ports from `ranges`, each port at most once."""

    def __init__(self, ranges: Sequence[range], seed: int | None = None) -> None:
        self.ranges = list(ranges)
        self._ports = [p for r in self.ranges for p in r]
        if not self._ports:
            raise ValueError("PortPool: no ports to hand out")
        self._cursor = random.Random(seed).randrange(len(self._ports))
        self._handed_out: set[int] = set()
        self._lock = threading.Lock()  # fixtures may start servers from threads

    def take(self, n: int = 1) -> int:
        """A port P with P .. P + n - 1 all in one range, never handed out before, and all
        bindable now; they count as handed out from here on."""
        if n < 1:
            raise ValueError(f"PortPool.take: n must be >= 1, got {n}")
        with self._lock:
            for _ in range(len(self._ports)):
                first = self._ports[self._cursor]
                self._cursor = (self._cursor + 1) % len(self._ports)
                run = range(first, first + n)
                if not any(run[0] in r and run[-1] in r for r in self.ranges):
                    continue  # the run would leave its range (into the ephemeral one)
                if self._handed_out.intersection(run) or not all(map(is_bindable, run)):
                    continue
                self._handed_out.update(run)
                self._cursor = (self._cursor + n - 1) % len(self._ports)
                return first
        raise RuntimeError(f"PortPool: no run of {n} free ports left in {self.ranges}")


# NOTE: one pool per test process, so no two callers in it ever get the same port.
_POOL = PortPool(candidate_ranges(ephemeral_range()))


def free_port() -> int:
    """A free port for a server on 127.0.0.1, not handed out before in this process."""
    return _POOL.take(1)


def free_port_run(n: int) -> int:
    """A port P with P .. P + n - 1 all free (DP rank r publishes KV events on P + 2r and
    answers replays on the next port)."""
    return _POOL.take(n)


def free_port_pair() -> int:
    """A port P with P and P + 1 free: a KV-event PUB port and its replay port."""
    return _POOL.take(2)


def is_address_in_use(exc: BaseException) -> bool:
    """Whether `exc` is a bind that failed because the port is taken. zmq's ZMQError is not an
    OSError but carries the same errno."""
    return getattr(exc, "errno", None) == errno.EADDRINUSE


def bind_retrying(bind: Callable[[int], T], num_ports: int = 1) -> T:
    """`bind(port)` on a fresh run of `num_ports` ports, again on another run while it fails
    with "address already in use" (another process took a port after it was probed)."""
    for _ in range(BIND_ATTEMPTS - 1):
        try:
            return bind(free_port_run(num_ports))
        except Exception as exc:  # re-raised unless it is EADDRINUSE
            if not is_address_in_use(exc):
                raise
    return bind(free_port_run(num_ports))


def listening_socket(port: int) -> socket.socket:
    """A TCP socket listening on 127.0.0.1:`port`, for a server run in this process (uvicorn
    takes it as `sockets=[...]`): the port is held from here on, with no window to lose it."""
    sock = socket.socket()
    try:
        sock.bind(("127.0.0.1", port))
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    return sock


class LostPort(RuntimeError):
    """A child exited at start-up because another process holds one of its ports."""


def lost_its_port(log: str) -> bool:
    """Whether a child's start-up log ends in a bind that failed because the port was taken
    (uvicorn: "[Errno 98] ... address already in use"; zmq: "Address already in use")."""
    tail = log[-4000:].lower()
    return "address already in use" in tail or "errno 98" in tail
