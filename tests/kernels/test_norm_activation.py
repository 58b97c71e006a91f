"""RMSNorm (with and without the fused residual) and SiLU-and-mul against their references."""

from __future__ import annotations

import pytest
import torch

from radixserve.kernels.activation import silu_and_mul
from radixserve.kernels.norm import rms_norm
from radixserve.kernels.reference import rms_norm_ref, silu_and_mul_ref
from tests.kernels.cases import DEVICES, DTYPES, assert_close, poisoned, randn

NORM_SHAPES = {"cpu": [(1, 16), (7, 48)], "cuda": [(1, 4096), (513, 4096), (64, 896)]}
MLP_SHAPES = {"cpu": [(1, 16), (5, 40)], "cuda": [(1, 14336), (300, 4864)]}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("with_residual", [False, True])
def test_rms_norm_matches_reference(
    device: str, dtype: torch.dtype, with_residual: bool, gen: torch.Generator
) -> None:
    for num_tokens, hidden in NORM_SHAPES[device]:
        x = randn(gen, num_tokens, hidden, dtype=dtype, device=device)
        weight = randn(gen, hidden, dtype=dtype, device=device)
        res = randn(gen, num_tokens, hidden, dtype=dtype, device=device) if with_residual else None
        out = poisoned(num_tokens, hidden, dtype=dtype, device=device)
        res_out = (
            poisoned(num_tokens, hidden, dtype=dtype, device=device) if res is not None else None
        )
        got = rms_norm(x, weight, 1e-6, res, out=out, residual_out=res_out)
        want = rms_norm_ref(x, weight, 1e-6, res)
        assert got.out is out and got.residual is res_out
        assert_close(got.out, want.out, dtype)
        if with_residual:
            assert got.residual is not None and want.residual is not None
            assert_close(got.residual, want.residual, dtype)
        else:
            assert got.residual is None


@pytest.mark.parametrize("device", DEVICES)
def test_rms_norm_in_place_over_its_inputs(device: str, gen: torch.Generator) -> None:
    """out may alias x and residual_out may alias residual (the engine's in-place use)."""
    x = randn(gen, 6, 32, dtype=torch.float32, device=device)
    res = randn(gen, 6, 32, dtype=torch.float32, device=device)
    weight = randn(gen, 32, dtype=torch.float32, device=device)
    want = rms_norm_ref(x, weight, 1e-5, res)
    got = rms_norm(x, weight, 1e-5, res, out=x, residual_out=res)
    assert got.out is x and got.residual is res
    assert want.residual is not None
    assert_close(x, want.out, torch.float32)
    assert_close(res, want.residual, torch.float32)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_and_mul_matches_reference(
    device: str, dtype: torch.dtype, gen: torch.Generator
) -> None:
    for num_tokens, inter in MLP_SHAPES[device]:
        x = randn(gen, num_tokens, 2 * inter, dtype=dtype, device=device)
        out = poisoned(num_tokens, inter, dtype=dtype, device=device)
        assert silu_and_mul(x, out=out) is out
        assert_close(out, silu_and_mul_ref(x), dtype)


def test_a_strided_last_dim_is_refused() -> None:
    """The kernels index the last dim with plain offsets: a transposed view must not pass."""
    x = torch.zeros(32, 6).T
    with pytest.raises(ValueError, match="x: the last dim must be contiguous"):
        rms_norm(x, torch.ones(32), 1e-6)
    with pytest.raises(ValueError, match="x: the last dim must be contiguous"):
        silu_and_mul(x)
