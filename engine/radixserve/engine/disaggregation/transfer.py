"""The one KV-transfer interface, and its backends.

A backend moves bytes from registered local memory into a peer's registered memory, named by
the peer's session id, in one blocking batch (`write` returns 0 on success). Both sides
register their KV buffers at start-up; only the prefill writes.

- `mooncake`: Mooncake's `TransferEngine` in P2P-handshake mode (no metadata server; the
  session id is host:rpc_port), over TCP on machines without RDMA (`MOONCAKE_PROTOCOL`, default
  tcp; `--disaggregation-ib-device` picks RDMA devices where there are some). Needs the
  `mooncake-transfer-engine` wheel (the `-non-cuda` one on CPUs) and libibverbs / librdmacm /
  libnuma.
- `nixl`: NVIDIA's NIXL agent over its UCX backend (the `nixl-cu12` wheel, whose UCX runs
  over TCP or shared memory on a CPU, RDMA / NVLink where present). The session id is
  `agent@host:port`, the agent's metadata listener: a writer fetches a peer's metadata from
  there once, then writes with `WRITE` transfers. DRAM on a CPU; VRAM of the rank's device on
  CUDA (untested here: no GPU).
- `fake`: unit tests only. A `memmove` inside one process: both sides must live in the same
  process (two `EngineCore`s); a write to another process's session fails.
"""

from __future__ import annotations

import ctypes
import logging
import os
import socket
import time
import uuid
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

    # Entries per batch_transfer_sync_write. mooncake-transfer-engine 0.3.13.post1 refuses a
    # batch of more than 2,048 (rc -1), and every later batch of that engine failed too (seen
    # here). A transfer has that many where its pages are scattered (runs × layers × K/V) or
    # where rows are re-sliced (tokens × layers × K/V), so it goes in slices of this many.
    MAX_BATCH = 1024

    def write(self, session: str, src: list[int], dst: list[int], lengths: list[int]) -> int:
        step = self.MAX_BATCH
        for i in range(0, len(src), step):
            batch = (src[i : i + step], dst[i : i + step], lengths[i : i + step])
            rc = int(self._engine.batch_transfer_sync_write(session, *batch))
            if rc != 0:
                return rc
        return 0

    def close(self) -> None:
        self._engine = None


class NixlBackend:
    """One NIXL agent per rank, with its metadata listener on a free port of `host`."""

    METADATA_WAIT_S = 10.0
    WRITE_TIMEOUT_S = 120.0

    def __init__(self, host: str, device: str = "cpu", ib_device: str | None = None) -> None:
        if not ib_device:
            # UCX's InfiniBand module, loaded where libibverbs is installed but no RDMA device
            # is (Mooncake's CPU setup), crashes the process at exit (nixl-cu12 1.5.1, seen
            # here): without --disaggregation-ib-device it is not loaded. UCX reads this when
            # the agent starts; a UCX_MODULES of the user's wins.
            os.environ.setdefault("UCX_MODULES", "^ib")
        try:
            from nixl_cu12._api import nixl_agent, nixl_agent_config
        except ImportError as exc:  # pragma: no cover - the Makefile installs it
            raise ValueError(
                f"disaggregation_transfer_backend: nixl needs the nixl-cu12 package ({exc})"
            ) from None
        port = _free_port(host)
        self._name = f"radixserve-{uuid.uuid4().hex[:16]}"
        config = nixl_agent_config(enable_listen_thread=True, listen_port=port, backends=["UCX"])
        self._agent: Any = nixl_agent(self._name, config)
        cuda = device.startswith("cuda")
        self._mem = "VRAM" if cuda else "DRAM"
        self._dev = int(device.partition(":")[2] or 0) if cuda else 0
        self._session = f"{self._name}@{host}:{port}"
        self._peers: set[str] = set()
        self._registered: list[Any] = []

    @property
    def session_id(self) -> str:
        return self._session

    def register(self, regions: list[tuple[int, int]]) -> None:
        descs = [(ptr, length, self._dev, "") for ptr, length in regions]
        self._registered.append(
            self._agent.register_memory(self._agent.get_reg_descs(descs, self._mem))
        )

    def _peer(self, session: str) -> str | None:
        """The peer agent's name once its metadata is here (fetched from its listener)."""
        name, _, address = session.partition("@")
        if name in self._peers:
            return name
        host, _, port = address.rpartition(":")
        self._agent.fetch_remote_metadata(name, host, int(port))
        deadline = time.monotonic() + self.METADATA_WAIT_S
        while not self._agent.check_remote_metadata(name):
            if time.monotonic() > deadline:
                logger.error("nixl: no metadata from %s", session)
                return None
            time.sleep(0.005)
        self._peers.add(name)
        return name

    def write(self, session: str, src: list[int], dst: list[int], lengths: list[int]) -> int:
        if not src:
            return 0
        peer = self._peer(session)
        if peer is None:
            return -1
        agent = self._agent
        local = agent.get_xfer_descs(
            [(a, n, self._dev) for a, n in zip(src, lengths, strict=True)], self._mem
        )
        remote = agent.get_xfer_descs(
            [(a, n, self._dev) for a, n in zip(dst, lengths, strict=True)], self._mem
        )
        handle = agent.initialize_xfer("WRITE", local, remote, peer)
        try:
            state = agent.transfer(handle)
            deadline = time.monotonic() + self.WRITE_TIMEOUT_S
            while state not in ("DONE", "ERR") and time.monotonic() < deadline:
                time.sleep(0.0005)
                state = agent.check_xfer_state(handle)
            return 0 if state == "DONE" else -1
        finally:
            agent.release_xfer_handle(handle)

    def close(self) -> None:
        """Disconnect and deregister before the agent goes (and before the KV buffers do):
        an agent torn down later, at interpreter exit, crashes the process."""
        agent, self._agent = self._agent, None
        if agent is None:
            return
        for peer in self._peers:
            agent.remove_remote_agent(peer)
        for descs in self._registered:
            agent.deregister_memory(descs)
        self._peers.clear()
        self._registered.clear()
        del agent


def _free_port(host: str) -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


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


def make_backend(
    name: str, host: str, ib_device: str | None = None, device: str = "cpu"
) -> TransferBackend:
    if name == "mooncake":
        return MooncakeBackend(host, ib_device)
    if name == "nixl":
        return NixlBackend(host, device, ib_device)
    if name == "fake":
        return FakeBackend()
    raise ValueError(f"disaggregation_transfer_backend: {name} is not one of {BACKENDS}")
