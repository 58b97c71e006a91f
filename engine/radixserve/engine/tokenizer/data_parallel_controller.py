"""DataParallelController: spreads requests over the D scheduling groups of one server.

With `--dp-size D` the server runs D independent scheduling groups (each a TP group of
scheduler processes with its own KV pool, radix cache and KV-event publisher). The controller
owns one push channel per DP rank (`PortArgs.scheduler_input_for`) and decides where each
generate request goes: to its `data_parallel_rank` when the client (or the router) pinned one,
else by `--load-balance-method` — `round_robin`, or `shortest_queue` (fewest requests
dispatched here and not yet finished; ties to the lowest rank). Aborts go to the rank that
holds the request (every rank for abort-all or an unknown rid); control requests go to every
rank, and the caller gathers one reply per rank.

NOTE: SGLang runs its controller as a process of its own; here it lives inside the tokenizer
manager's asyncio loop, which already sees every request start and finish — so
shortest_queue counts exact in-flight requests without a load feed from the schedulers.
With D = 1 it is a single channel and no decision. Runs in the main process.
"""

from __future__ import annotations

from typing import Any

import msgspec
import zmq.asyncio

from radixserve.engine.configs.server_args import LOAD_BALANCE_METHODS
from radixserve.engine.ipc.channels import AsyncPushChannel, PortArgs
from radixserve.engine.ipc.messages import AbortReq, TokenizedGenerateReq


class DataParallelController:
    def __init__(
        self,
        ctx: zmq.asyncio.Context,
        ports: PortArgs,
        dp_size: int = 1,
        method: str = "round_robin",
    ) -> None:
        if method not in LOAD_BALANCE_METHODS:
            raise ValueError(f"load_balance_method: must be one of {LOAD_BALANCE_METHODS}")
        self.dp_size, self.method = dp_size, method
        self.channels = [
            AsyncPushChannel(ctx, ports.scheduler_input_for(r, dp_size), bind=True)
            for r in range(dp_size)
        ]
        self.in_flight = [0] * dp_size
        self.rank_of: dict[str, int] = {}  # rid → the DP rank it was sent to
        self._next = 0

    def pick(self, pinned: int | None) -> int:
        """The DP rank for a new request (`pinned` is already validated at the edge)."""
        if pinned is not None:
            return pinned
        if self.method == "shortest_queue":
            return min(range(self.dp_size), key=lambda r: (self.in_flight[r], r))
        rank, self._next = self._next, (self._next + 1) % self.dp_size
        return rank

    async def send_generate(self, req: TokenizedGenerateReq) -> int:
        rank = self.pick(req.data_parallel_rank)
        self.rank_of[req.rid] = rank
        self.in_flight[rank] += 1
        await self.channels[rank].send(req)
        return rank

    def finished(self, rid: str) -> None:
        """The request left the server (finished, aborted, client gone): release its slot."""
        rank = self.rank_of.pop(rid, None)
        if rank is not None:
            self.in_flight[rank] -= 1

    async def send_abort(self, msg: AbortReq) -> None:
        rank = None if msg.abort_all else self.rank_of.get(msg.rid)
        if rank is not None:
            await self.channels[rank].send(msg)
        else:
            await self.broadcast(msg)

    async def send_to(self, rank: int, msg: msgspec.Struct) -> None:
        """To one DP rank (the tokenizer manager knows which rank holds its request)."""
        await self.channels[rank].send(msg)

    async def broadcast(self, msg: msgspec.Struct) -> None:
        for channel in self.channels:
            await channel.send(msg)

    def loads(self) -> list[dict[str, Any]]:
        """Requests in flight per DP rank, as the controller counts them."""
        return [{"dp_rank": r, "in_flight": n} for r, n in enumerate(self.in_flight)]
