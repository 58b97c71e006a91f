"""The AMX projection kernel (kernels/cpu/amx_gemm.cpp) against F.linear in float32.

The oracle is torch's F.linear on the same bfloat16 values upcast to float32 (exact products,
float32 sums). The kernel sums in float32 too, in another order, and rounds once to bfloat16,
so each element must lie within half a bfloat16 ulp of the oracle plus the float32 reordering
bound (2⁻²⁰ of Σ|x·w|). Inputs are fresh per case: row counts around the 16- and 32-row tile
groups, column counts with an odd number of 16-column blocks, strided and 3-d inputs, bias,
and float32 output (the logits' form). They skip only where the CPU has no AMX-BF16; where it
has, a kernel that does not build fails them with the compiler's error (`tests/kernels/amx.py`).
"""

from __future__ import annotations

import pytest
import torch

from radixserve.kernels.cpu.amx_gemm import AmxGemm, AmxWeight, packable
from tests.kernels.amx import amx_gemm_or_skip
from tests.kernels.gemm_oracle import assert_within_bound, gemm_case

ROWS = [0, 1, 5, 16, 17, 32, 33, 70, 300]
SHAPES = [(16, 32), (48, 64), (80, 96), (960, 576)]  # (n, k): 1, 3, 5 and 60 column blocks


@pytest.fixture(scope="module")
def amx() -> AmxGemm:
    return amx_gemm_or_skip()


@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize(("n", "k"), SHAPES)
def test_linear_matches_float32_oracle(amx: AmxGemm, rows: int, n: int, k: int) -> None:
    w, x, bias = gemm_case(n, k, rows, seed=rows * 7919 + n + k)
    packed = amx.pack(w)
    assert packed is not None and packed.data.numel() == n * k
    for b in (None, bias):
        got = amx.linear(x, packed, b)
        assert got.shape == (rows, n) and got.dtype == torch.bfloat16
        assert_within_bound(got, x, w, b)


@pytest.mark.parametrize("rows", [1, 33])
def test_float32_output_and_3d_input(amx: AmxGemm, rows: int) -> None:
    w, x, bias = gemm_case(80, 96, rows * 2, seed=rows)
    x3 = x.contiguous().view(2, rows, 96)
    packed = amx.pack(w)
    assert packed is not None
    got = amx.linear(x3, packed, bias, out_dtype=torch.float32)
    assert got.shape == (2, rows, 80) and got.dtype == torch.float32
    assert_within_bound(got.view(-1, 80), x3.view(-1, 96), w, bias)


def test_pack_refuses_shapes_and_dtypes_it_does_not_take(amx: AmxGemm) -> None:
    for weight in (
        torch.zeros(24, 64, dtype=torch.bfloat16),  # n not a multiple of 16
        torch.zeros(32, 48, dtype=torch.bfloat16),  # k not a multiple of 32
        torch.zeros(32, 64, dtype=torch.float32),
        torch.zeros(64, 32, dtype=torch.bfloat16).t(),  # columns not contiguous
    ):
        assert not packable(weight) and amx.pack(weight) is None


def test_linear_rejects_inputs_with_a_clear_error(amx: AmxGemm) -> None:
    packed = amx.pack(torch.ones(16, 32, dtype=torch.bfloat16))
    assert isinstance(packed, AmxWeight)
    with pytest.raises(ValueError, match="bfloat16"):
        amx.linear(torch.ones(2, 32), packed)  # float32 input
    with pytest.raises(ValueError, match="32"):
        amx.linear(torch.ones(2, 64, dtype=torch.bfloat16), packed)  # wrong k
    with pytest.raises(ValueError, match="bias"):
        amx.linear(torch.ones(2, 32, dtype=torch.bfloat16), packed, torch.ones(8))
    with pytest.raises(ValueError, match="float16"):
        amx.linear(torch.ones(2, 32, dtype=torch.bfloat16), packed, out_dtype=torch.float16)
