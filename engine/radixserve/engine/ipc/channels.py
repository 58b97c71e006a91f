"""Typed ZMQ channels: a PUSH/PULL pair bound to a msgspec codec for one message union.

Sync sockets serve the scheduler and detokenizer loops; the async variants serve the
tokenizer manager's asyncio loop. Addresses are `ipc://` files in a per-server temp dir
(under $TMPDIR). A frame that does not decode as the channel's union raises
msgspec.DecodeError in the receiver: these sockets carry only our own processes' messages.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from typing import Any

import msgspec
import zmq
import zmq.asyncio


@dataclass(frozen=True, slots=True)
class PortArgs:
    """IPC endpoints of one server: one scheduler input per DP rank (read by its TP rank 0,
    which broadcasts to its peers), one detokenizer input and one tokenizer-manager input."""

    scheduler_input: str
    detokenizer_input: str
    tokenizer_input: str

    @classmethod
    def create(cls) -> PortArgs:
        base = tempfile.mkdtemp(prefix="radixserve-")
        return cls(
            scheduler_input=f"ipc://{os.path.join(base, 'scheduler')}",
            detokenizer_input=f"ipc://{os.path.join(base, 'detokenizer')}",
            tokenizer_input=f"ipc://{os.path.join(base, 'tokenizer')}",
        )

    def scheduler_input_for(self, dp_rank: int, dp_size: int) -> str:
        """DP rank `dp_rank`'s scheduler input (the one `scheduler_input` when dp_size is 1)."""
        return self.scheduler_input if dp_size == 1 else f"{self.scheduler_input}-dp{dp_rank}"


class PushChannel:
    def __init__(self, ctx: zmq.Context[Any], address: str, bind: bool) -> None:
        self.sock = ctx.socket(zmq.PUSH)
        self.sock.setsockopt(zmq.LINGER, 0)
        (self.sock.bind if bind else self.sock.connect)(address)
        self.encoder = msgspec.msgpack.Encoder()

    def send(self, msg: msgspec.Struct) -> None:
        self.sock.send(self.encoder.encode(msg), copy=False)

    def close(self) -> None:
        self.sock.close()


class PullChannel:
    def __init__(self, ctx: zmq.Context[Any], address: str, bind: bool, msg_type: Any) -> None:
        self.sock = ctx.socket(zmq.PULL)
        self.sock.setsockopt(zmq.LINGER, 0)
        (self.sock.bind if bind else self.sock.connect)(address)
        self.decoder = msgspec.msgpack.Decoder(msg_type)

    def recv(self, timeout_ms: int | None = None) -> Any | None:
        """One message, or None if none arrived within timeout_ms (0 = non-blocking)."""
        if timeout_ms is not None and not self.sock.poll(timeout_ms):
            return None
        return self.decoder.decode(self.sock.recv(copy=False).buffer)

    def drain(self) -> list[Any]:
        out = []
        while (msg := self.recv(0)) is not None:
            out.append(msg)
        return out

    def close(self) -> None:
        self.sock.close()


class AsyncPushChannel:
    def __init__(self, ctx: zmq.asyncio.Context, address: str, bind: bool) -> None:
        self.sock = ctx.socket(zmq.PUSH)
        self.sock.setsockopt(zmq.LINGER, 0)
        (self.sock.bind if bind else self.sock.connect)(address)
        self.encoder = msgspec.msgpack.Encoder()

    async def send(self, msg: msgspec.Struct) -> None:
        await self.sock.send(self.encoder.encode(msg), copy=False)


class AsyncPullChannel:
    def __init__(self, ctx: zmq.asyncio.Context, address: str, bind: bool, msg_type: Any) -> None:
        self.sock = ctx.socket(zmq.PULL)
        self.sock.setsockopt(zmq.LINGER, 0)
        (self.sock.bind if bind else self.sock.connect)(address)
        self.decoder = msgspec.msgpack.Decoder(msg_type)

    async def recv(self) -> Any:
        frame = await self.sock.recv(copy=False)
        return self.decoder.decode(frame.buffer)
