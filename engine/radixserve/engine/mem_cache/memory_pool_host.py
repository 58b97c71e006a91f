"""HostKVPool: HiCache's host tier, a bounded copy space for the KV of device-pool slots.

One tensor [buffers, size + 1, heads × head_dim], buffer-major like the device pool, so each
copy is one row gather per layer buffer (a page read out for storage is gathered the same
way). The buffers mirrored are the device pool's K and V per layer (an MLA pool's latent rows
only: its V buffers are views of them). Slot 0 is never handed out, as in the device pool.
Each TP rank holds its own heads. Owned by the HiRadixCache of one scheduler rank; on a CPU
engine both tiers are RAM, and the host tier is what the device pool's budget does not cover.
"""

from __future__ import annotations

import torch

from radixserve.engine.mem_cache.allocator import TokenToKVPoolAllocator
from radixserve.engine.mem_cache.memory_pool import MHATokenToKVPool, MLATokenToKVPool


def _mirrored_buffers(device_pool: MHATokenToKVPool) -> list[torch.Tensor]:
    if isinstance(device_pool, MLATokenToKVPool):
        return list(device_pool.k_buffer)  # V is a view of K: copying K moves both
    return [*device_pool.k_buffer, *device_pool.v_buffer]


def host_pool_tokens(
    device_pool: MHATokenToKVPool, ratio: float, size_gb: float, page_size: int
) -> int:
    """The host pool's size in tokens: `size_gb` per rank when set, else `ratio` × the device
    pool; a whole number of pages."""
    if size_gb > 0:
        tokens = int(size_gb * (1 << 30) // device_pool.bytes_per_token())
    else:
        tokens = int(device_pool.size * ratio)
    return tokens // page_size * page_size


class HostKVPool:
    def __init__(self, device_pool: MHATokenToKVPool, size: int) -> None:
        self.device_pool = device_pool
        self.size = size
        self._src = [b.view(b.shape[0], -1) for b in _mirrored_buffers(device_pool)]
        self.row = self._src[0].shape[1]  # heads × head_dim of one token in one buffer
        shape = (len(self._src), size + 1, self.row)
        self.data = torch.empty(shape, dtype=device_pool.dtype, device="cpu")
        self._slots = TokenToKVPoolAllocator(size, torch.device("cpu"))

    def bytes_per_token(self) -> int:
        return int(len(self._src) * self.row * self.data.element_size())

    def available_size(self) -> int:
        return self._slots.available_size()

    def alloc(self, n: int) -> torch.Tensor | None:
        """n host slots (int64, CPU), or None when fewer are free."""
        return self._slots.alloc(n)

    def free(self, slots: torch.Tensor) -> None:
        self._slots.free(slots)

    def clear(self) -> None:
        self._slots.clear()

    def backup_from_device(self, device_slots: torch.Tensor, host_slots: torch.Tensor) -> None:
        """Copy the KV of `device_slots` (every layer) into `host_slots`."""
        dev = device_slots.to(self._src[0].device, torch.int64)
        host = host_slots.to(torch.int64)
        for b, buf in enumerate(self._src):
            self.data[b].index_copy_(0, host, buf.index_select(0, dev).to("cpu"))

    def load_to_device(self, host_slots: torch.Tensor, device_slots: torch.Tensor) -> None:
        """Copy the KV in `host_slots` back into `device_slots` (every layer)."""
        dev = device_slots.to(self._src[0].device, torch.int64)
        host = host_slots.to(torch.int64)
        for b, buf in enumerate(self._src):
            buf.index_copy_(0, dev, self.data[b].index_select(0, host).to(buf.device))

    def read_tokens(self, host_slots: torch.Tensor) -> bytes:
        """The raw KV of `host_slots`, in order (for a storage backend)."""
        block = self.data.index_select(1, host_slots.to(torch.int64))
        return block.view(torch.uint8).numpy().tobytes()

    def write_tokens(self, host_slots: torch.Tensor, raw: bytes) -> None:
        """The inverse of `read_tokens`; `raw` must hold exactly len(host_slots) tokens."""
        flat = torch.frombuffer(bytearray(raw), dtype=torch.uint8)
        block = flat.view(self.data.dtype).view(len(self._src), len(host_slots), self.row)
        self.data.index_copy_(1, host_slots.to(torch.int64), block)
