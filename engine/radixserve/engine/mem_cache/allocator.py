"""Token-slot allocators over the KV pool: one slot at a time (page size 1) or whole pages.

Contract shared by both: slot 0 is reserved; `alloc*` returns None and takes nothing when the
pool cannot cover the request (the caller then evicts from the prefix cache or retracts);
`free` accepts any slots previously handed out. For the paged allocator a page is free only
when all of its slots are, and requests never share a partially filled page.
NOTE: the free lists are host bookkeeping of the scheduler (no device sync per step); slots
come out as host int64 tensors and are copied to `device`, the pool's, where they are written.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch


class BaseTokenAllocator(ABC):
    def __init__(self, size: int, page_size: int, device: torch.device) -> None:
        self.size = size
        self.page_size = page_size
        self.device = device

    @abstractmethod
    def available_size(self) -> int:
        """Number of token slots that can still be handed out."""

    @abstractmethod
    def alloc_extend(
        self, prefix_lens: list[int], seq_lens: list[int], last_locs: list[int]
    ) -> torch.Tensor | None:
        """Slots for positions [prefix_len, seq_len) of each request, concatenated in order.
        `last_locs[i]` is the slot of position prefix_len − 1 (−1 when prefix_len is 0)."""

    @abstractmethod
    def free(self, slots: torch.Tensor) -> None:
        """Return slots to the pool."""

    @abstractmethod
    def clear(self) -> None:
        """Forget every allocation."""


class TokenToKVPoolAllocator(BaseTokenAllocator):
    """Page size 1: a free list of slots 1..size."""

    def __init__(self, size: int, device: torch.device) -> None:
        super().__init__(size, 1, device)
        self._free = torch.empty(0, dtype=torch.int64)  # [n] int64 free slots, host
        self.clear()

    def available_size(self) -> int:
        return int(self._free.numel())

    def alloc(self, n: int) -> torch.Tensor | None:
        if n > self._free.numel():
            return None
        out, self._free = self._free[:n], self._free[n:]
        return out

    def alloc_extend(
        self, prefix_lens: list[int], seq_lens: list[int], last_locs: list[int]
    ) -> torch.Tensor | None:
        return self.alloc(sum(s - p for p, s in zip(prefix_lens, seq_lens, strict=True)))

    def free(self, slots: torch.Tensor) -> None:
        if slots.numel():
            self._free = torch.cat((self._free, slots.to(torch.int64).cpu()))

    def clear(self) -> None:
        self._free = torch.arange(1, self.size + 1, dtype=torch.int64)


class PagedTokenToKVPoolAllocator(BaseTokenAllocator):
    """Pages of `page_size` slots; page p covers slots [p·size, (p+1)·size), page 0 reserved."""

    def __init__(self, size: int, page_size: int, device: torch.device) -> None:
        if size % page_size:
            raise ValueError(f"max_total_tokens {size} is not a multiple of page_size {page_size}")
        super().__init__(size, page_size, device)
        self.num_pages = size // page_size
        self._free_pages: list[int] = []
        self.clear()

    def available_size(self) -> int:
        return len(self._free_pages) * self.page_size

    def _slots_for(self, prefix: int, seq: int, last_loc: int, pages: list[int]) -> list[int]:
        out: list[int] = []
        pos, loc = prefix, last_loc
        while pos < seq:
            if pos % self.page_size == 0:
                loc = pages.pop() * self.page_size
            else:
                loc += 1  # continue the request's partially filled last page
            out.append(loc)
            pos += 1
        return out

    def alloc_extend(
        self, prefix_lens: list[int], seq_lens: list[int], last_locs: list[int]
    ) -> torch.Tensor | None:
        ps = self.page_size
        need = sum(-(-s // ps) - -(-p // ps) for p, s in zip(prefix_lens, seq_lens, strict=True))
        if need > len(self._free_pages):
            return None
        taken = self._free_pages[len(self._free_pages) - need :]
        del self._free_pages[len(self._free_pages) - need :]
        pages = list(reversed(taken))
        slots: list[int] = []
        for p, s, last in zip(prefix_lens, seq_lens, last_locs, strict=True):
            slots += self._slots_for(p, s, last, pages)
        return torch.tensor(slots, dtype=torch.int64)

    def free(self, slots: torch.Tensor) -> None:
        if not slots.numel():
            return
        # NOTE: owners free whole pages in one call (all of a request's slots, or a
        # page-aligned tree node), so each page id appears in at most one call.
        pages = torch.unique(slots.to(torch.int64).cpu() // self.page_size).tolist()
        self._free_pages.extend(pages)

    def clear(self) -> None:
        self._free_pages = list(range(self.num_pages, 0, -1))


def create_allocator(size: int, page_size: int, device: torch.device) -> BaseTokenAllocator:
    if page_size < 1:
        raise ValueError(f"page_size must be ≥ 1, got {page_size}")
    if page_size == 1:
        return TokenToKVPoolAllocator(size, device)
    return PagedTokenToKVPoolAllocator(size, page_size, device)
