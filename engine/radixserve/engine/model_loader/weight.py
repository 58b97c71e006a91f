"""LazyWeight: a checkpoint tensor read on demand, whole or one slice, so a tensor-parallel
rank reads only its rows or columns of a safetensors file (GGUF: the tensor is dequantized
whole, then sliced: quantized blocks do not split along arbitrary rows).

Helpers take either a LazyWeight or a plain tensor; they never know about ranks.
"""

from __future__ import annotations

from typing import Any

import torch


class LazyWeight:
    """One named checkpoint tensor, not yet read (safetensors `get_slice` handle)."""

    def __init__(self, handle: Any) -> None:
        self._handle = handle
        self.shape = tuple(int(s) for s in handle.get_shape())

    def narrow(self, dim: int, start: int, length: int) -> torch.Tensor:
        index = [slice(None)] * len(self.shape)
        index[dim] = slice(start, start + length)
        out: torch.Tensor = self._handle[tuple(index)]
        return out

    def full(self) -> torch.Tensor:
        return self.narrow(0, 0, self.shape[0]) if self.shape else self._handle[()]


Weight = torch.Tensor | LazyWeight


def weight_shape(w: Weight) -> tuple[int, ...]:
    return tuple(w.shape)


def read_slice(w: Weight, dim: int, start: int, length: int) -> torch.Tensor:
    """w[..., start:start+length, ...] along `dim`, reading only that part when lazy."""
    if isinstance(w, LazyWeight):
        return w.narrow(dim, start, length)
    return w.narrow(dim, start, length)


def read_full(w: Weight) -> torch.Tensor:
    return w.full() if isinstance(w, LazyWeight) else w
