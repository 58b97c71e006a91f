"""The sampler's bitmask application against xgrammar's own (`apply_token_bitmask_inplace`),
and rows without a grammar left bit for bit."""

from __future__ import annotations

import pytest
import torch
import xgrammar as xgr

from radixserve.engine.sampling.vocab_mask import apply_vocab_mask


@pytest.mark.parametrize("vocab", [32, 49152, 50001])
def test_matches_xgrammar_and_leaves_free_rows_alone(vocab: int) -> None:
    gen = torch.Generator().manual_seed(vocab)
    logits = torch.randn(5, vocab, generator=gen)
    mask = xgr.allocate_token_bitmask(5, vocab)  # all allowed
    bits = torch.randint(-(2**31), 2**31 - 1, mask[1:4].shape, generator=gen, dtype=torch.int64)
    mask[1:4] = bits.to(torch.int32)
    ours, theirs = logits.clone(), logits.clone()
    apply_vocab_mask(ours, mask)
    xgr.apply_token_bitmask_inplace(theirs, mask, backend="torch_native")
    assert torch.equal(ours, theirs)
    assert torch.equal(ours[0], logits[0]) and torch.equal(ours[4], logits[4])
    assert torch.isinf(ours[1:4]).any()
