"""The C++ paged kernel's shared-prefix entry (AMX tiles for a prefix many decode rows share)
against attention computed in float32 by PyTorch on the same bf16 K/V.

Rows may be strided views (as q arrives from the fused qkv projection), members may be any
subset of the rows, own keys after the prefix may be none or a few, and the non-members go
through the plain path in the same call. Skips only where the CPU has no AMX-BF16 (the engine
then keeps the plain kernel: `shared_fn` is None); where it has, a kernel that does not build,
or builds without the shared entry, fails them (`tests/kernels/amx.py`).
"""

from __future__ import annotations

import pytest
import torch

from radixserve.engine.attention.paged_cpu import (
    SHARED_BLOCK,
    SOURCE,
    PagedAttentionKernel,
    load_paged_kernel,
)
from radixserve.engine.attention.shared_prefix import find_decode_prefix
from radixserve.kernels.cpu.build import open_library
from tests.kernels.amx import skip_without_amx

# bf16 outputs of magnitude ≤ ~2 (half a step: 2^-8) plus the bf16-rounded probabilities
ATOL = 8e-3


@pytest.fixture(scope="module")
def kernel() -> PagedAttentionKernel:
    """The paged kernel with its AMX shared-prefix entry."""
    skip_without_amx()
    open_library(SOURCE)  # raises with the compiler's error where the build fails
    loaded = load_paged_kernel()
    assert loaded is not None and loaded.shared_fn is not None, "built without the AMX entry"
    return loaded


def reference(q, k, v, slots, lens, scale):  # type: ignore[no-untyped-def]
    """Row r: softmax(q·kᵀ · scale) · v over its first lens[r] slots, in float32."""
    g = q.shape[1] // k.shape[1]
    out = torch.empty(q.shape)
    for r in range(q.shape[0]):
        ks = k[slots[r, : lens[r]]].float().repeat_interleave(g, 1)
        vs = v[slots[r, : lens[r]]].float().repeat_interleave(g, 1)
        w = torch.softmax(torch.einsum("hd,lhd->hl", q[r].float(), ks) * scale, -1)
        out[r] = torch.einsum("hl,lhd->hd", w, vs)
    return out


def make_case(rows: int, prefix: int, hq: int, hkv: int, d: int, own_max: int, seed: int):  # type: ignore[no-untyped-def]
    gen = torch.Generator().manual_seed(seed)
    width = prefix + own_max + 1
    pool = prefix + rows * width + 1
    k = torch.randn(pool, hkv, d, generator=gen).to(torch.bfloat16)
    # Values around +1 on the prefix and -1 after it: each output is then a visible mix of
    # the two parts, so a mis-weighted merge of the prefix's partial result shows.
    v = torch.randn(pool, hkv, d, generator=gen) * 0.5 - 1.0
    v[1 : prefix + 1] += 2.0
    v = v.to(torch.bfloat16)
    slots = torch.zeros(rows, width, dtype=torch.int64)
    fresh = torch.randperm(pool - prefix - 1, generator=gen) + prefix + 1
    for r in range(rows):
        slots[r, :prefix] = torch.arange(1, prefix + 1)
        slots[r, prefix:] = fresh[r * (width - prefix) : (r + 1) * (width - prefix)]
    lens = prefix + torch.randint(0, own_max + 1, (rows,), generator=gen)
    qkv = torch.randn(rows, hq * d + 2 * hkv * d, generator=gen).to(torch.bfloat16)
    q = qkv[:, : hq * d].view(rows, hq, d)  # strided rows, as from the qkv projection
    return q, k, v, slots, lens


@pytest.mark.parametrize(
    ("hq", "hkv", "d"), [(9, 3, 64), (4, 4, 64), (8, 4, 64), (8, 1, 64), (8, 2, 128), (4, 1, 128)]
)
@pytest.mark.parametrize("members", ["all", "some"])
def test_shared_prefix_matches_float32_attention(
    kernel: PagedAttentionKernel, hq: int, hkv: int, d: int, members: str
) -> None:
    rows, prefix = 11, 3 * SHARED_BLOCK
    q, k, v, slots, lens = make_case(rows, prefix, hq, hkv, d, own_max=120, seed=hq * d + hkv)
    lens[0] = prefix  # a member with no keys of its own after the prefix
    picked = torch.arange(rows) if members == "all" else torch.tensor([0, 2, 3, 5, 8, 10])
    scale = d**-0.5
    kv_row = torch.arange(rows)
    got = kernel.shared(q, k, v, slots, kv_row, lens, scale, slots[0, :prefix].clone(), picked)
    assert got is not None
    want = reference(q, k, v, slots, lens, scale)
    torch.testing.assert_close(got.float(), want, atol=ATOL, rtol=0)
    # and the plain kernel gives the same answer to bf16 rounding
    plain = kernel(q, k, v, slots, kv_row, lens, scale)
    torch.testing.assert_close(got.float(), plain.float(), atol=ATOL, rtol=0)


def test_a_member_that_does_not_share_the_prefix_is_an_error(
    kernel: PagedAttentionKernel,
) -> None:
    q, k, v, slots, lens = make_case(6, 2 * SHARED_BLOCK, 9, 3, 64, own_max=8, seed=1)
    slots[4, 7] = slots[4, -1]  # row 4's prefix differs in one slot
    with pytest.raises(RuntimeError, match="shared prefix"):
        kernel.shared(
            q, k, v, slots, torch.arange(6), lens, 0.125, slots[0, :64].clone(), torch.arange(6)
        )


def test_unsupported_layouts_fall_back(kernel: PagedAttentionKernel) -> None:
    """float32, or a prefix that is not whole blocks: None (the caller runs the plain path)."""
    q, k, v, slots, lens = make_case(4, 2 * SHARED_BLOCK, 9, 3, 64, own_max=4, seed=2)
    rows, prefix = torch.arange(4), slots[0, :64].clone()
    qf, kf, vf = q.float(), k.float(), v.float()
    assert kernel.shared(qf, kf, vf, slots, rows, lens, 0.1, prefix, rows) is None
    assert kernel.shared(q, k, v, slots, rows, lens, 0.1, prefix[:40].clone(), rows) is None


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
