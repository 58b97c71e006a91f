"""The Triton fused ops (`radixserve.kernels.fused_ops.TritonFusedOps`) against the engine's
PyTorch layer code they replace: RMSNorm (+ residual), SiluAndMul, `apply_rotary` on q/k
views of a qkv projection, and FusedMoE with its router (`select_experts`).

Under TRITON_INTERPRET=1 (no CUDA) on CPU tensors at tiny shapes, `gpu`-marked on CUDA at
real shapes. Inputs are fresh per test; rows are strided (views into a wider buffer, as a
fused projection's outputs are) and row counts ragged. Tolerances: fp32 within 1e-5 (sum
order, rsqrt/exp approximations); fp16 / bf16 round where PyTorch rounds, so at least 99 %
of elements must be identical and every one within two steps of the dtype (a flipped
intermediate carries into the next product). The fused MoE sums fp32 products of GEMMs
accumulated in another order (TF32 on a GPU in fp32): the kernel tolerances of `cases.py`.
"""

from __future__ import annotations

import pytest
import torch

from radixserve.engine.layers.activation import SiluAndMul
from radixserve.engine.layers.layernorm import RMSNorm
from radixserve.engine.layers.moe import ExpertRange, FusedMoE, select_experts
from radixserve.engine.layers.rotary_embedding import RotaryCosSin, apply_rotary
from radixserve.kernels.fused_ops import TritonFusedOps
from tests.kernels.cases import DEVICES, DTYPES, TOLERANCES, randn

OPS = TritonFusedOps()
NORM_SHAPES = {"cpu": [(1, 16), (7, 48), (13, 40)], "cuda": [(1, 4096), (513, 4096), (67, 896)]}
MLP_SHAPES = {"cpu": [(1, 16), (5, 40)], "cuda": [(1, 14336), (300, 4864)]}
# (tokens, q heads, kv heads, head_dim)
ROPE_SHAPES = {"cpu": [(1, 4, 2, 16), (9, 3, 1, 32)], "cuda": [(1, 32, 8, 128), (517, 14, 2, 64)]}
# (tokens, experts, hidden, inter, top_k)
MOE_SHAPES = {
    "cpu": [(1, 8, 32, 24, 2), (11, 8, 32, 24, 2)],
    "cuda": [(7, 64, 2048, 768, 8), (300, 64, 2048, 768, 8)],
}


def close_to_torch(got: torch.Tensor, want: torch.Tensor) -> None:
    """fp32: 1e-5; fp16 / bf16: >= 99 % identical, all within two steps of the dtype."""
    assert got.dtype == want.dtype and got.shape == want.shape
    assert not torch.isnan(got).any()
    if want.dtype == torch.float32:
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
        return
    step = 2.0**-7 if want.dtype == torch.bfloat16 else 2.0**-10
    diff = (got.float() - want.float()).abs()
    bound = 2.02 * step * want.float().abs().clamp_min(2.0**-14)
    assert bool((diff <= bound).all()), f"max diff {diff.max().item()}"
    assert (got != want).float().mean().item() <= 1e-2


def strided(gen: torch.Generator, rows: int, cols: int, dtype: torch.dtype, device: str):
    """[rows, cols] whose rows are 2 * cols apart (a view into a wider projection output)."""
    return randn(gen, rows, 2 * cols, dtype=dtype, device=device)[:, cols // 2 : cols // 2 + cols]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("with_residual", [False, True])
def test_rmsnorm_equals_the_layer(
    device: str, dtype: torch.dtype, with_residual: bool, gen: torch.Generator
) -> None:
    for rows, hidden in NORM_SHAPES[device]:
        layer = RMSNorm(hidden, eps=1e-6).to(device=device, dtype=dtype)
        layer.weight.data = randn(gen, hidden, dtype=dtype, device=device)
        x = strided(gen, rows, hidden, dtype, device)
        res = strided(gen, rows, hidden, dtype, device) if with_residual else None
        x_before = x.clone()
        want_out, want_sum = layer(x, res)
        got = OPS.rmsnorm(x, layer.weight, layer.eps, res)
        assert got is not None
        close_to_torch(got[0], want_out)
        torch.testing.assert_close(got[1], want_sum, atol=0, rtol=0)  # one rounded add
        torch.testing.assert_close(x, x_before, atol=0, rtol=0)  # inputs untouched


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_and_mul_equals_the_layer(
    device: str, dtype: torch.dtype, gen: torch.Generator
) -> None:
    for rows, inter in MLP_SHAPES[device]:
        x = strided(gen, rows, 2 * inter, dtype, device)
        got = OPS.silu_and_mul(x)
        assert got is not None
        close_to_torch(got, SiluAndMul()(x))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_rotary_in_place_equals_apply_rotary(
    device: str, dtype: torch.dtype, gen: torch.Generator
) -> None:
    for tokens, hq, hkv, d in ROPE_SHAPES[device]:
        # q, k are views of one qkv projection (token stride (hq + 2 hkv) * d), as in attention
        qkv = randn(gen, tokens, (hq + 2 * hkv) * d, dtype=dtype, device=device)
        q = qkv[:, : hq * d].view(tokens, hq, d)
        k = qkv[:, hq * d : (hq + hkv) * d].view(tokens, hkv, d)
        v_before = qkv[:, (hq + hkv) * d :].clone()
        angles = torch.rand(tokens, 1, d // 2, generator=gen) * 100
        angles = torch.cat((angles, angles), -1).to(device)
        cos, sin = angles.cos().to(dtype), angles.sin().to(dtype)
        want_q, want_k = apply_rotary(q, k, RotaryCosSin(cos, sin))  # PyTorch: fused is None
        assert OPS.rotary_(q, k, cos, sin)
        close_to_torch(q, want_q)
        close_to_torch(k, want_k)
        torch.testing.assert_close(qkv[:, (hq + hkv) * d :], v_before, atol=0, rtol=0)


def _moe_layer(
    gen: torch.Generator, experts: int, hidden: int, inter: int, rng: ExpertRange | None,
    dtype: torch.dtype, device: str,
) -> FusedMoE:  # fmt: skip
    layer = FusedMoE(experts, hidden, inter, rng).to(device)
    layer.w13_weight.data = randn(gen, *layer.w13_weight.shape, dtype=dtype, device=device)
    layer.w2_weight.data = randn(gen, *layer.w2_weight.shape, dtype=dtype, device=device)
    layer.w13_weight.data *= hidden**-0.5
    layer.w2_weight.data *= inter**-0.5
    return layer


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("ep", [False, True], ids=["all-experts", "expert-slice"])
def test_fused_moe_equals_the_layer(
    device: str, dtype: torch.dtype, ep: bool, gen: torch.Generator
) -> None:
    """Routing (softmax top-k, renormalised) and the experts against the PyTorch path; with
    `ep` the layer holds experts [2, 6) of 8 (or a quarter of 64) and the others add nothing."""
    for tokens, experts, hidden, inter, top_k in MOE_SHAPES[device]:
        rng = ExpertRange(experts // 4, experts // 4 + experts // 2) if ep else None
        layer = _moe_layer(gen, experts, hidden, inter, rng, dtype, device)
        x = strided(gen, tokens, hidden, dtype, device)
        logits = randn(gen, tokens, experts, dtype=dtype, device=device)
        want_topk = select_experts(logits, top_k, True)
        chosen = OPS.select_experts(logits, top_k, True)
        assert chosen is not None
        weights, ids = chosen
        assert ids.dtype == torch.int64
        # the same experts unless two probabilities tie within rounding; then the same weights
        atol, rtol = TOLERANCES[(device, torch.float32)]
        torch.testing.assert_close(weights, want_topk.weights, atol=1e-6, rtol=1e-5)
        want = layer.forward_f32(x, want_topk)
        layer.fused = OPS
        got = layer.forward_f32(x, want_topk)
        assert got.dtype == torch.float32 and not torch.isnan(got).any()
        atol, rtol = TOLERANCES[(device, dtype)]
        torch.testing.assert_close(got, want, atol=atol, rtol=rtol)
        if ep:  # a token whose choices are all elsewhere gets exactly zero
            held = (want_topk.ids >= rng.start) & (want_topk.ids < rng.end)  # type: ignore[union-attr]
            assert bool((got[~held.any(1)] == 0).all())


def test_ops_refuse_what_they_do_not_take() -> None:
    """None / False, touching nothing, so the layer runs its PyTorch code."""
    x = torch.randn(4, 32)
    w = torch.ones(32)
    assert OPS.rmsnorm(x.T.contiguous().T, w, 1e-6) is None  # strided last dim
    assert OPS.rmsnorm(x, w.double(), 1e-6) is None  # dtype mismatch
    assert OPS.rmsnorm(x, w, 1e-6, torch.randn(3, 32)) is None  # residual shape
    assert OPS.rmsnorm(x.to(torch.int32), w.to(torch.int32), 1e-6) is None
    assert OPS.silu_and_mul(torch.randn(4, 7)) is None  # odd width
    assert OPS.silu_and_mul(x.double()) is None
    q, k = torch.randn(3, 4, 16), torch.randn(3, 2, 16)
    q0, k0 = q.clone(), k.clone()
    assert not OPS.rotary_(q, k, torch.ones(3, 1, 8), torch.ones(3, 1, 8))  # table width
    assert not OPS.rotary_(q, k, torch.ones(3, 1, 16).double(), torch.ones(3, 1, 16).double())
    assert torch.equal(q, q0) and torch.equal(k, k0)


@pytest.mark.parametrize("device", DEVICES)
def test_zero_rows(device: str) -> None:
    """An empty batch (an idle DP rank's forward) returns empty outputs."""
    x = torch.empty(0, 32, device=device)
    got = OPS.rmsnorm(x, torch.ones(32, device=device), 1e-6, x)
    assert got is not None and got[0].shape == (0, 32) and got[1].shape == (0, 32)
    out = OPS.silu_and_mul(torch.empty(0, 32, device=device))
    assert out is not None and out.shape == (0, 16)
    q = torch.empty(0, 4, 16, device=device)
    assert OPS.rotary_(q, q[:, :2], torch.empty(0, 1, 16, device=device),
                       torch.empty(0, 1, 16, device=device))  # fmt: skip
