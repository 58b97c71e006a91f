"""Where a scheduler rank gets its inputs each loop round, and where its outputs go.

With one rank the scheduler reads its ZMQ channel. Under tensor parallelism rank 0 of the
ranks that schedule together (the TP group, or under DP attention one DP rank's attention-TP
group) reads the channel and broadcasts the round's messages (msgpack-encoded, over that
group's CPU gloo group) to its peers, every round, even when empty: so they see the same
messages in the same rounds and schedule identical batches in lock-step. Peers send nothing
(`DiscardSender`): only rank 0 answers the tokenizer and feeds the detokenizer. Runs in the
scheduler process.
"""

from __future__ import annotations

from typing import Any, Protocol

import msgspec

from radixserve.engine.distributed import GroupHandle
from radixserve.engine.ipc.channels import PullChannel
from radixserve.engine.ipc.messages import SchedulerInput


class Sender(Protocol):
    def send(self, msg: msgspec.Struct) -> None: ...


class DiscardSender:
    """The output side of a TP peer: rank 0 sends the replies and outputs."""

    def send(self, msg: msgspec.Struct) -> None:
        pass


class RequestSource(Protocol):
    def poll(self, timeout_ms: int) -> list[Any]:
        """This round's messages (waiting up to timeout_ms for the first one)."""
        ...


class ChannelSource:
    """One rank: the messages come straight from the tokenizer manager's channel."""

    def __init__(self, recv: PullChannel) -> None:
        self.recv = recv

    def poll(self, timeout_ms: int) -> list[Any]:
        first = self.recv.recv(timeout_ms)
        return [first, *self.recv.drain()] if first is not None else []


class BroadcastSource:
    """TP: rank 0 polls `recv` and broadcasts; peers (recv None) take rank 0's messages.

    NOTE: a collective on every round: a peer blocks here until rank 0 has polled, which is
    what keeps the ranks in step; the CPU group's timeout is long for idle servers."""

    def __init__(self, recv: PullChannel | None, cpu: GroupHandle) -> None:
        if (recv is None) == cpu.is_first:
            raise ValueError("exactly TP rank 0 reads the request channel")
        self.recv = recv
        self.cpu = cpu
        self.encoder = msgspec.msgpack.Encoder()
        self.decoder = msgspec.msgpack.Decoder(list[SchedulerInput])

    def poll(self, timeout_ms: int) -> list[Any]:
        if self.recv is not None:
            msgs = ChannelSource(self.recv).poll(timeout_ms)
            self.cpu.broadcast_bytes(self.encoder.encode(msgs) if msgs else b"")
            return msgs
        payload = self.cpu.broadcast_bytes(None)
        return list(self.decoder.decode(payload)) if payload else []
