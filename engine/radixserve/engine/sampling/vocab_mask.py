"""Applying a grammar's token bitmask to logits: forbidden tokens get −inf.

The bitmask is xgrammar's layout ([B, ceil(V/32)] int32, bit j of word w = token 32·w + j
allowed), which every grammar backend fills. Plain torch, so it runs on any device; only rows
that forbid something are touched, so unconstrained rows keep their logits bit for bit.
"""

from __future__ import annotations

import torch

ALL_ALLOWED = -1  # a word with all 32 bits set


def unpack_vocab_mask(mask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[R, W] int32 bitmask → [R, vocab_size] bool, True where the token is allowed."""
    shifts = torch.arange(32, dtype=torch.int32, device=mask.device)
    bits = (mask.unsqueeze(-1) >> shifts) & 1  # [R, W, 32]
    return bits.reshape(mask.shape[0], -1)[:, :vocab_size].bool()


def apply_vocab_mask(logits: torch.Tensor, mask: torch.Tensor) -> None:
    """Set logits [B, V] (float) to −inf where `mask` [B, ceil(V/32)] int32 forbids, in place.

    A token id past the mask's width (a logits row wider than 32·W) counts as forbidden."""
    mask = mask.to(logits.device)
    rows = (mask != ALL_ALLOWED).any(dim=1).nonzero().squeeze(1)
    if rows.numel() == 0:
        return
    vocab = logits.shape[1]
    allowed = torch.zeros(rows.numel(), vocab, dtype=torch.bool, device=logits.device)
    width = min(vocab, mask.shape[1] * 32)
    allowed[:, :width] = unpack_vocab_mask(mask[rows], width)
    logits[rows] = logits[rows].masked_fill(~allowed, float("-inf"))
