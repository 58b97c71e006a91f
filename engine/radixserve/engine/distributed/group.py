"""GroupHandle: one process group with this rank's place in it and the collectives the engine
uses (all-reduce, all-gather, all-to-all, broadcast and all-gather of bytes, min of an int).

Runs in every scheduler process. A group of size 1 (`GroupHandle.single()`) performs no
communication, so the single-process engine runs the same layer code with no torch.distributed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist


@dataclass(frozen=True, slots=True)
class GroupHandle:
    rank: int  # this process's rank inside the group
    size: int
    group: Any = None  # torch.distributed ProcessGroup; None when size == 1
    device: torch.device = torch.device("cpu")  # where this group's tensors must live

    @classmethod
    def single(cls, device: torch.device | None = None) -> GroupHandle:
        return cls(0, 1, None, device or torch.device("cpu"))

    @property
    def is_first(self) -> bool:
        return self.rank == 0

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum x over the group, in place; returns x."""
        if self.size > 1:
            dist.all_reduce(x, group=self.group)
        return x

    def all_gather(self, x: torch.Tensor, dim: int = -1) -> torch.Tensor:
        """Concatenate every rank's x (same shape on every rank) along `dim`, rank order."""
        if self.size == 1:
            return x
        parts = [torch.empty_like(x) for _ in range(self.size)]
        dist.all_gather(parts, x.contiguous(), group=self.group)
        return torch.cat(parts, dim=dim)

    def broadcast(self, x: torch.Tensor, src: int = 0) -> torch.Tensor:
        """Overwrite x on every rank with the group rank `src`'s x, in place; returns x."""
        if self.size > 1:
            dist.broadcast(x, dist.get_global_rank(self.group, src), group=self.group)
        return x

    def broadcast_bytes(self, payload: bytes | None, src: int = 0) -> bytes:
        """Rank `src` passes its payload, the others None; every rank returns src's bytes.

        Two broadcasts (length, then bytes). The caller encodes typed messages (msgspec):
        nothing is pickled across ranks."""
        if self.size == 1:
            return payload or b""
        length = torch.tensor([len(payload) if payload is not None else 0], dtype=torch.int64)
        self.broadcast(length, src)
        n = int(length.item())
        if n == 0:
            return b""
        if self.rank == src and payload is not None:
            buf = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
        else:
            buf = torch.empty(n, dtype=torch.uint8)
        self.broadcast(buf, src)
        return buf.numpy().tobytes()

    def all_gather_bytes(self, payload: bytes) -> list[bytes]:
        """Every rank's payload, rank order (lengths first, then the bytes padded to the
        longest). As with broadcast_bytes, the caller encodes typed messages."""
        if self.size == 1:
            return [payload]
        length = torch.tensor([len(payload)], dtype=torch.int64)
        lengths = [torch.empty_like(length) for _ in range(self.size)]
        dist.all_gather(lengths, length, group=self.group)
        sizes = [int(t.item()) for t in lengths]
        longest = max(sizes)
        if longest == 0:
            return [b""] * self.size
        buf = torch.zeros(longest, dtype=torch.uint8)
        if payload:
            buf[: len(payload)] = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
        parts = [torch.empty_like(buf) for _ in range(self.size)]
        dist.all_gather(parts, buf, group=self.group)
        return [p[:n].numpy().tobytes() for p, n in zip(parts, sizes, strict=True)]

    def all_to_all(
        self, x: torch.Tensor, send_counts: list[int], recv_counts: list[int]
    ) -> torch.Tensor:
        """Rows of x, `send_counts[r]` consecutive ones for rank r in rank order, go to rank r;
        returns the `sum(recv_counts)` rows received, rank order (`all_to_all_single`)."""
        if self.size == 1:
            return x
        out = x.new_empty((sum(recv_counts), *x.shape[1:]))
        dist.all_to_all_single(out, x.contiguous(), recv_counts, send_counts, group=self.group)
        return out

    def min_int(self, value: int) -> int:
        """The smallest `value` over the group (e.g. the KV pool size every rank can hold)."""
        if self.size == 1:
            return value
        t = torch.tensor([value], dtype=torch.int64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MIN, group=self.group)
        return int(t.item())
