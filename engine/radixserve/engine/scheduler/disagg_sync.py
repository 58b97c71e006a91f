"""One prefill/decode round agreed by the TP ranks of one side.

TP ranks schedule in lock-step (tp_broadcast), so every decision of the PD queues must be the
same on every rank: which room's KV arrived, which timed out, which prefill died. Rank 0 alone
talks to the peer side, so it brings what it saw this round (its clock, the control messages
it received, and on a decode what it learnt of prefill servers); every rank brings the writes
its transfer thread finished. One all-gather over the side's CPU group gives all of it to every
rank, and each applies the same inputs to the same state. A room's write is over only when
every rank's part is (`Completions`): its pages are never freed while a rank still reads them.
With one rank nothing is exchanged. Runs in the scheduler process.
"""

from __future__ import annotations

import logging
from typing import Any

import msgspec

from radixserve.engine.disaggregation.kv_manager import TransferResult
from radixserve.engine.disaggregation.wire import PrefillInfo, RankKV
from radixserve.engine.distributed import GroupHandle

logger = logging.getLogger(__name__)


class RankRound(msgspec.Struct, frozen=True):
    """What one rank brings to a round. Only rank 0's clock, messages and lookups are used."""

    now: float = 0.0
    msgs: list[bytes] = []
    done: list[TransferResult] = []
    resolved: dict[str, PrefillInfo | str] = {}  # decode: prefill address → info or error
    dead: list[str] = []  # decode: prefills that stopped answering
    restarted: list[str] = []  # decode: prefills answering under a new session


class RoundSync:
    """The side's TP ranks: their CPU group, and every rank's KV buffers and heads."""

    def __init__(self, cpu: GroupHandle, mine: RankKV) -> None:
        self.cpu = cpu
        self.encoder = msgspec.msgpack.Encoder()
        self.decoder = msgspec.msgpack.Decoder(RankRound)
        gathered = cpu.all_gather_bytes(self.encoder.encode(mine))
        self.ranks = [msgspec.msgpack.decode(p, type=RankKV) for p in gathered]

    @property
    def lead(self) -> bool:
        return self.cpu.is_first

    def exchange(self, mine: RankRound) -> list[RankRound]:
        """Every rank's round, rank order (a collective: every rank calls it each round)."""
        if self.cpu.size == 1:
            return [mine]
        payloads = self.cpu.all_gather_bytes(self.encoder.encode(mine))
        return [self.decoder.decode(p) for p in payloads]


def decode_msgs(raw: list[bytes], msg_type: Any) -> list[Any]:
    """Control messages as `msg_type` (a union); one that does not decode is dropped."""
    decoder = msgspec.msgpack.Decoder(msg_type)
    out: list[Any] = []
    for payload in raw:
        try:
            out.append(decoder.decode(payload))
        except msgspec.DecodeError:
            logger.warning("disaggregation: undecodable control message dropped")
    return out


class Completions:
    """Per room, the ranks' finished parts of its write; a room is done when all are in."""

    def __init__(self, num_ranks: int) -> None:
        self.num_ranks = num_ranks
        self.parts: dict[int, list[TransferResult]] = {}

    def add(self, rounds: list[RankRound]) -> list[TransferResult]:
        """The rooms whose every part finished this round, each as one result: the first
        failure's rc, the bytes of all parts, the slowest part's time."""
        out: list[TransferResult] = []
        for result in (r for rnd in rounds for r in rnd.done):
            parts = self.parts.setdefault(result.room, [])
            parts.append(result)
            if len(parts) < self.num_ranks:
                continue
            del self.parts[result.room]
            rc = next((p.rc for p in parts if p.rc != 0), 0)
            num_bytes = sum(p.num_bytes for p in parts)
            seconds = max(p.seconds for p in parts)
            out.append(TransferResult(result.room, rc, parts[0].num_pages, num_bytes, seconds))
        return out
