"""ReqToTokenPool (request row × position → KV slot), MHATokenToKVPool (per-layer K/V) and
MLATokenToKVPool (per-layer latent rows, DeepSeek's MLA).

Slot 0 of the KV pool is never handed out: padded entries (CUDA-graph padding, idle ranks)
write there harmlessly. Pools are plain tensors owned by the ModelRunner of one rank.
"""

from __future__ import annotations

import torch


class ReqToTokenPool:
    """Rows of KV slot indices, one row per running request."""

    def __init__(self, size: int, max_context_len: int, device: torch.device) -> None:
        self.size = size
        self.max_context_len = max_context_len
        self.req_to_token = torch.zeros((size, max_context_len), dtype=torch.int32, device=device)
        self._free_rows: list[int] = list(range(size))

    def available_size(self) -> int:
        return len(self._free_rows)

    def alloc(self, n: int) -> list[int] | None:
        """n free rows, or None (nothing taken) when fewer are free."""
        if n > len(self._free_rows):
            return None
        rows, self._free_rows = self._free_rows[:n], self._free_rows[n:]
        return rows

    def free(self, row: int) -> None:
        self._free_rows.append(row)

    def write(self, row: int, start: int, slots: torch.Tensor) -> None:
        """req_to_token[row, start:start+len(slots)] = slots."""
        self.req_to_token[row, start : start + slots.numel()] = slots.to(torch.int32)

    def clear(self) -> None:
        self._free_rows = list(range(self.size))


def _kv_buffer(
    shape: tuple[int, int, int], dtype: torch.dtype, device: torch.device, page_size: int
) -> torch.Tensor:
    """One layer's K or V buffer. Every slot is written before any attention reads it, but
    for the reserved page 0 (slot 0: where padding rows point), which is zeroed. On the CPU
    the rest is left unwritten, so the OS backs it with memory only as slots are first used
    (resident memory grows with the cache, as vLLM's CPU pool does, instead of the whole pool
    at start-up); on devices the buffer is zeroed whole (device memory is reserved anyway)."""
    if device.type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    buffer = torch.empty(shape, dtype=dtype, device=device)
    buffer[:page_size].zero_()
    return buffer


class MHATokenToKVPool:
    """K and V buffers per layer: [size + page_size, num_kv_heads, head_dim]."""

    def __init__(  # noqa: PLR0913 - the shape of a KV pool has this many independent facts
        self,
        size: int,
        page_size: int,
        dtype: torch.dtype,
        num_kv_heads: int,
        head_dim: int,
        num_layers: int,
        device: torch.device,
    ) -> None:
        self.size = size
        self.page_size = page_size
        self.dtype = dtype
        self.device = device
        shape = (size + page_size, num_kv_heads, head_dim)
        self.k_buffer = [_kv_buffer(shape, dtype, device, page_size) for _ in range(num_layers)]
        self.v_buffer = [_kv_buffer(shape, dtype, device, page_size) for _ in range(num_layers)]

    @staticmethod
    def cell_size_bytes(
        num_kv_heads: int, head_dim: int, num_layers: int, dtype: torch.dtype
    ) -> int:
        """Bytes of K+V for one token across all layers."""
        elem = torch.tensor([], dtype=dtype).element_size()
        return 2 * num_layers * num_kv_heads * head_dim * elem

    def set_kv_buffer(
        self, layer_id: int, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> None:
        """loc: [T] int64 slots; k, v: [T, num_kv_heads, head_dim]."""
        self.k_buffer[layer_id][loc] = k.to(self.dtype)
        self.v_buffer[layer_id][loc] = v.to(self.dtype)

    def get_kv_buffer(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.k_buffer[layer_id], self.v_buffer[layer_id]

    def bytes_per_token(self) -> int:
        """What one token's KV costs in this pool, all layers together (measured on the
        buffers, not recomputed from the config)."""
        k, v = self.k_buffer[0], self.v_buffer[0]
        per_layer = k[0].numel() * k.element_size() + v[0].numel() * v.element_size()
        return per_layer * len(self.k_buffer)


class MLATokenToKVPool(MHATokenToKVPool):
    """DeepSeek's latent cache: one row per token per layer, [size + page_size, 1, kv_lora_rank
    + qk_rope_head_dim] (the normalised kv_a, then the roped k_pe). Absorbed MLA attends it as
    one KV head: the whole row is the key, its first kv_lora_rank values are the value, so
    `v_buffer[i]` is a view of `k_buffer[i]` and storing a row writes the key only. Every
    query head of every attention-TP rank reads the same rows (TP replicates the pool; DP
    attention splits the tokens instead)."""

    def __init__(  # noqa: PLR0913 - the shape of a KV pool has this many independent facts
        self,
        size: int,
        page_size: int,
        dtype: torch.dtype,
        kv_lora_rank: int,
        qk_rope_head_dim: int,
        num_layers: int,
        device: torch.device,
    ) -> None:
        self.size = size
        self.page_size = page_size
        self.dtype = dtype
        self.device = device
        self.kv_lora_rank = kv_lora_rank
        shape = (size + page_size, 1, kv_lora_rank + qk_rope_head_dim)
        self.k_buffer = [_kv_buffer(shape, dtype, device, page_size) for _ in range(num_layers)]
        self.v_buffer = [k[..., :kv_lora_rank] for k in self.k_buffer]

    @staticmethod
    def latent_cell_size_bytes(
        kv_lora_rank: int, qk_rope_head_dim: int, num_layers: int, dtype: torch.dtype
    ) -> int:
        """Bytes of the latent rows of one token across all layers."""
        elem = torch.tensor([], dtype=dtype).element_size()
        return (kv_lora_rank + qk_rope_head_dim) * num_layers * elem

    def set_kv_buffer(
        self, layer_id: int, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> None:
        """loc: [T] slots; k: [T, 1, kv_lora_rank + rope] latent rows (v, their first
        kv_lora_rank columns, is already in them)."""
        self.k_buffer[layer_id][loc] = k.to(self.dtype)

    def bytes_per_token(self) -> int:
        """The latent row's bytes, all layers (the value views add none)."""
        k = self.k_buffer[0]
        return k[0].numel() * k.element_size() * len(self.k_buffer)
