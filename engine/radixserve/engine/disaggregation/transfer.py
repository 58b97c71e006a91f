"""The one KV-transfer interface, and its backends.

A backend moves bytes from registered local memory into a peer's registered memory, named by
the peer's session id, in one blocking batch (`write` returns 0 on success). Both sides
register their KV buffers at start-up; only the prefill writes.

- `mooncake`: Mooncake's `TransferEngine` in P2P-handshake mode (no metadata server; the
  session id is host:rpc_port), over TCP on machines without RDMA (`MOONCAKE_PROTOCOL`, default
  tcp; `--disaggregation-ib-device` picks RDMA devices where there are some). Needs the
  `mooncake-transfer-engine` wheel (the `-non-cuda` one on CPUs) and libibverbs / librdmacm /
  libnuma.
- `fake`: unit tests only. A `memmove` inside one process: both sides must live in the same
  process (two `EngineCore`s); a write to another process's session fails.
- `nixl`: named for SGLang's flag; not implemented here, refused at start-up.
"""

from __future__ import annotations

import ctypes
import logging
import os
from typing import Any, Protocol

logger = logging.getLogger(__name__)

BACKENDS = ("mooncake", "nixl", "fake")


class TransferBackend(Protocol):
    @property
    def session_id(self) -> str:
        """How a peer names this side in `write`."""
        ...

    def register(self, regions: list[tuple[int, int]]) -> None:
        """Make (address, length) regions reachable by peers' writes."""
        ...

    def write(self, session: str, src: list[int], dst: list[int], lengths: list[int]) -> int:
        """Copy each local src[i] … + lengths[i] to the peer's dst[i]; 0 on success."""
        ...

    def close(self) -> None: ...


class MooncakeBackend:
    def __init__(self, host: str, ib_device: str | None = None) -> None:
        try:
            from mooncake.engine import TransferEngine
        except ImportError as exc:  # pragma: no cover - the Makefile installs it
            raise ValueError(
                "disaggregation_transfer_backend: mooncake needs the "
                "mooncake-transfer-engine(-non-cuda) package and libibverbs1 / librdmacm1 / "
                f"libnuma1 ({exc})"
            ) from None
        self._engine: Any = TransferEngine()
        protocol = os.environ.get("MOONCAKE_PROTOCOL", "rdma" if ib_device else "tcp")
        rc = self._engine.initialize(host, "P2PHANDSHAKE", protocol, ib_device or "")
        if rc != 0:
            raise RuntimeError(f"Mooncake TransferEngine.initialize({host}, {protocol}) = {rc}")
        self._session = f"{host}:{self._engine.get_rpc_port()}"

    @property
    def session_id(self) -> str:
        return self._session

    def register(self, regions: list[tuple[int, int]]) -> None:
        ptrs, lens = [p for p, _ in regions], [n for _, n in regions]
        rc = self._engine.batch_register_memory(ptrs, lens)
        if rc != 0:
            raise RuntimeError(f"Mooncake batch_register_memory = {rc}")

    def write(self, session: str, src: list[int], dst: list[int], lengths: list[int]) -> int:
        if not src:
            return 0
        return int(self._engine.batch_transfer_sync_write(session, src, dst, lengths))

    def close(self) -> None:
        self._engine = None


class FakeBackend:
    """In-process copies, for unit tests of the queues without a transfer engine."""

    def __init__(self) -> None:
        self._session = f"fake:{os.getpid()}"

    @property
    def session_id(self) -> str:
        return self._session

    def register(self, regions: list[tuple[int, int]]) -> None:
        return None

    def write(self, session: str, src: list[int], dst: list[int], lengths: list[int]) -> int:
        if session != self._session:
            logger.error("fake transfer backend: peer %s is not in this process", session)
            return -1
        for s, d, n in zip(src, dst, lengths, strict=True):
            ctypes.memmove(d, s, n)
        return 0

    def close(self) -> None:
        return None


def make_backend(name: str, host: str, ib_device: str | None = None) -> TransferBackend:
    if name == "mooncake":
        return MooncakeBackend(host, ib_device)
    if name == "fake":
        return FakeBackend()
    raise ValueError(
        f"disaggregation_transfer_backend: {name} is not implemented in radixserve; use mooncake"
    )
