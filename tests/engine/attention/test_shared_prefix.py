"""Which decode rows go to the paged kernel's shared-prefix entry: `find_decode_prefix` takes
the largest group of rows whose slot rows start with the same slots, cut to whole AMX blocks
and to the kernel's cap (the kernel itself: tests/kernels/test_cpu_paged_attention.py)."""

from __future__ import annotations

import torch

from radixserve.engine.attention.shared_prefix import find_decode_prefix
from radixserve.kernels.cpu.paged_attention import SHARED_BLOCK


def test_find_decode_prefix_takes_the_largest_sharing_group() -> None:
    """Rows 0-4 share slots 1..100, rows 5-6 another prefix; each row's last key is its own
    new token. The group is rows 0-4, cut to whole blocks (96)."""
    table = torch.zeros(8, 140, dtype=torch.int64)
    for r in range(5):
        table[r, :100] = torch.arange(1, 101)
        table[r, 100:] = 1000 + r * 100 + torch.arange(40)
    for r in (5, 6):
        table[r] = 5000 + r * 200 + torch.arange(140)
    table[7, :50] = torch.arange(1, 51)  # too short to count
    lens = [130, 120, 101 + 1, 140, 125, 140, 140, 50]
    found = find_decode_prefix(table, lens, SHARED_BLOCK, 4096)
    assert found is not None
    assert found.members.tolist() == [0, 1, 2, 3, 4]
    assert found.slots.tolist() == list(range(1, 97))
    # capped: at most max_keys of the prefix go on tiles
    capped = find_decode_prefix(table, lens, SHARED_BLOCK, 70)
    assert capped is not None and capped.slots.tolist() == list(range(1, 65))
    # fewer than four sharing rows: no group
    assert find_decode_prefix(table[3:7], lens[3:7], SHARED_BLOCK, 4096) is None
