"""What both sides of a prefill/decode pair share: the timeouts (SGLang's environment
variables), the transfer counters they report, and the memory of rooms already ended."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field


def _env_seconds(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{name}: expected seconds, got {raw!r}") from None
    if value <= 0:
        raise ValueError(f"{name}: must be > 0, got {raw!r}")
    return value


@dataclass(frozen=True, slots=True)
class DisaggConfig:
    """bootstrap_timeout_s: a prefill waits this long for the decode's KVRequest;
    waiting_timeout_s: a decode waits this long for the KV once it asked (and a prefill for
    the ack); heartbeat_s / heartbeat_failures: how a decode notices a dead prefill;
    abort_drain_s: how long an aborted decode room keeps its pages waiting for KVDrained."""

    bootstrap_timeout_s: float = 300.0
    waiting_timeout_s: float = 300.0
    heartbeat_s: float = 5.0
    heartbeat_failures: int = 2
    abort_drain_s: float = 30.0
    bootstrap_retries: int = 15  # GETs of a prefill's /route, one a second, before giving up

    @classmethod
    def from_env(cls) -> DisaggConfig:
        prefix = "SGLANG_DISAGGREGATION_"
        return cls(
            bootstrap_timeout_s=_env_seconds(prefix + "BOOTSTRAP_TIMEOUT", 300.0),
            waiting_timeout_s=_env_seconds(prefix + "WAITING_TIMEOUT", 300.0),
            heartbeat_s=_env_seconds(prefix + "HEARTBEAT_INTERVAL", 5.0),
            heartbeat_failures=int(_env_seconds(prefix + "HEARTBEAT_MAX_FAILURE", 2)),
            abort_drain_s=_env_seconds(prefix + "DEFERRED_DECODE_KV_RELEASE_TIMEOUT", 30.0),
        )


@dataclass(slots=True)
class DisaggStats:
    """Counters since start (the load output carries them to /metrics and /get_load)."""

    pages: int = 0
    bytes: int = 0
    seconds: float = 0.0
    transfers: int = 0
    transfer_failed: int = 0
    bootstrap_failed: int = 0

    def count_transfer(self, pages: int, num_bytes: int, seconds: float = 0.0) -> None:
        self.pages += pages
        self.bytes += num_bytes
        self.seconds += seconds
        self.transfers += 1

    def load_fields(self) -> dict[str, int | float]:
        return {
            "kv_transfer_pages_total": self.pages,
            "kv_transfer_bytes_total": self.bytes,
            "kv_transfer_seconds_total": self.seconds,
            "kv_transfers_total": self.transfers,
            "kv_transfer_failed_total": self.transfer_failed,
            "bootstrap_failed_total": self.bootstrap_failed,
        }


@dataclass(slots=True)
class Tombstones:
    """Rooms that ended here, with why, for `ttl_s`: a late message for one is answered
    (or dropped), never allowed to open the room again."""

    ttl_s: float
    rooms: dict[int, tuple[str, float]] = field(default_factory=dict)

    def add(self, room: int, why: str, now: float) -> None:
        self.rooms[room] = (why, now)

    def get(self, room: int) -> str | None:
        entry = self.rooms.get(room)
        return None if entry is None else entry[0]

    def expire(self, now: float) -> None:
        for room, (_, since) in list(self.rooms.items()):
            if now - since > self.ttl_s:
                del self.rooms[room]


def advertised_host(bind_host: str) -> str:
    """The address peers reach this server at: the bind address, or this machine's name's
    address when it binds every interface."""
    if bind_host in ("0.0.0.0", "::", ""):
        return socket.gethostbyname(socket.gethostname())
    return bind_host
