"""The fused CPU ops (kernels/cpu/fused_ops.cpp) against PyTorch's own op chains.

The oracle is plain PyTorch written as HF transformers writes these layers (LlamaRMSNorm,
the gated SiLU MLP, rotate_half rotary), not our layer code. Inputs are fresh per case;
strided rows (views into a fused projection) and row counts that are not a multiple of the
16-lane vectors are included. In bfloat16 the ops round where PyTorch rounds, so results
must be identical except for rare flips of the last bit from float32 reduction order and
the vectorised exp (counted: at most 0.5 % of elements, each within two ulps, as a flipped
silu(gate) carries into its product).
"""

from __future__ import annotations

import shutil

import pytest
import torch
import torch.nn.functional as F

from radixserve.kernels.cpu.fused_ops import CpuFusedOps, load_fused_ops

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="no C++ compiler")

DTYPES = [torch.float32, torch.bfloat16]
ROWS = [1, 7, 32, 300]


@pytest.fixture(scope="module")
def ops() -> CpuFusedOps:
    loaded = load_fused_ops()
    assert loaded is not None, "g++ is present, so the library must build"
    return loaded


def _hf_rmsnorm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    return w * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def _close(got: torch.Tensor, want: torch.Tensor) -> None:
    """float32: within 2e-6 relative; bfloat16: at most 0.5 % of elements, by ≤ 2 ulps."""
    assert got.dtype == want.dtype and got.shape == want.shape
    if want.dtype == torch.float32:
        torch.testing.assert_close(got, want, rtol=2e-6, atol=2e-6)
        return
    diff = (got.float() - want.float()).abs()
    ulp = want.float().abs().clamp_min(1e-30) * 2.0**-7
    assert bool((diff <= 2.02 * ulp).all()), f"max diff {diff.max().item()}"
    assert (got != want).float().mean().item() <= 5e-3


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("hidden", [576, 100])
def test_rmsnorm_with_and_without_residual(
    ops: CpuFusedOps, dtype: torch.dtype, rows: int, hidden: int
) -> None:
    g = torch.Generator().manual_seed(rows * 1000 + hidden)
    # x is a strided view (every other column block of a wider buffer), as a projection is
    wide = torch.randn(rows, hidden * 2, generator=g).to(dtype)
    x = wide[:, :hidden]
    residual = torch.randn(rows, hidden, generator=g).to(dtype)
    w = (torch.randn(hidden, generator=g) * 0.5 + 1).to(dtype)
    out = ops.rmsnorm(x, w, 1e-5, residual)
    assert out is not None
    normed, summed = out
    want_sum = x + residual
    assert torch.equal(summed, want_sum)  # one rounding of one add: exact
    _close(normed, _hf_rmsnorm(want_sum, w, 1e-5))
    plain = ops.rmsnorm(x, w, 1e-6)
    assert plain is not None and plain[1] is x
    _close(plain[0], _hf_rmsnorm(x, w, 1e-6))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("d", [1536, 72])
def test_silu_and_mul(ops: CpuFusedOps, dtype: torch.dtype, rows: int, d: int) -> None:
    g = torch.Generator().manual_seed(rows + d)
    x = (torch.randn(rows, 2 * d, generator=g) * 4).to(dtype)
    got = ops.silu_and_mul(x)
    assert got is not None
    _close(got, F.silu(x[:, :d]) * x[:, d:])


def _hf_rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tokens", [1, 5, 64])
@pytest.mark.parametrize(("hq", "hkv", "d"), [(9, 3, 64), (4, 4, 128), (2, 1, 40)])
def test_rotary_in_place_on_qkv_views(  # noqa: PLR0913 - one parameter per shape axis
    ops: CpuFusedOps, dtype: torch.dtype, tokens: int, hq: int, hkv: int, d: int
) -> None:
    g = torch.Generator().manual_seed(tokens * 7 + hq + d)
    qkv = torch.randn(tokens, (hq + 2 * hkv) * d, generator=g).to(dtype)
    before = qkv.clone()
    q = qkv[:, : hq * d].view(tokens, hq, d)
    k = qkv[:, hq * d : (hq + hkv) * d].view(tokens, hkv, d)
    angles = torch.rand(tokens, d // 2, generator=g) * 100
    emb = torch.cat((angles, angles), dim=-1)
    cos, sin = emb.cos().unsqueeze(1).to(dtype), emb.sin().unsqueeze(1).to(dtype)
    q0, k0 = before[:, : hq * d].view(tokens, hq, d), before[:, hq * d : (hq + hkv) * d]
    k0 = k0.view(tokens, hkv, d)
    want_q = q0 * cos + _hf_rotate_half(q0) * sin
    want_k = k0 * cos + _hf_rotate_half(k0) * sin
    assert ops.rotary_(q, k, cos, sin)
    _close(q, want_q)
    _close(k, want_k)
    assert torch.equal(qkv[:, (hq + hkv) * d :], before[:, (hq + hkv) * d :])  # v untouched


def test_unsupported_tensors_are_refused_untouched(ops: CpuFusedOps) -> None:
    """Layouts or dtypes the kernels do not index return None/False, so callers fall back."""
    x = torch.randn(4, 8)
    assert ops.rmsnorm(x.t(), torch.ones(4), 1e-6) is None  # last dim not contiguous
    assert ops.rmsnorm(x, torch.ones(8, dtype=torch.float16), 1e-6) is None  # weight dtype
    assert ops.rmsnorm(x.half(), torch.ones(8).half(), 1e-6) is None  # float16
    assert ops.silu_and_mul(torch.randn(4, 7)) is None  # odd width
    q, k = torch.randn(3, 2, 8), torch.randn(3, 1, 8)
    cos = torch.randn(3, 1, 8, dtype=torch.bfloat16)
    saved = q.clone()
    assert not ops.rotary_(q, k, cos, cos)  # table dtype differs from q's
    assert torch.equal(q, saved)


def test_the_library_builds_into_an_empty_cache_once(
    tmp_path: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    from radixserve.kernels.cpu.build import build_library
    from radixserve.kernels.cpu.fused_ops import SOURCE

    monkeypatch.setenv("RADIXSERVE_KERNEL_CACHE", str(tmp_path))
    first = build_library(SOURCE)
    assert first.parent == tmp_path and first.name.startswith("fused_ops-")
    built_at = first.stat().st_mtime_ns
    assert build_library(SOURCE) == first and first.stat().st_mtime_ns == built_at


@pytest.mark.parametrize("vocab", [1, 17, 33, 49152])
@pytest.mark.parametrize("rows", [1, 5, 32])
def test_greedy_takes_the_first_maximum_and_its_log_softmax(
    ops: CpuFusedOps, rows: int, vocab: int
) -> None:
    g = torch.Generator().manual_seed(rows * 31 + vocab)
    wide = torch.randn(rows, vocab + 3, generator=g) * 4
    logits = wide[:, :vocab]  # strided rows
    if vocab > 20:  # ties: torch.argmax returns the first
        top = logits.max(dim=-1).values + 1
        logits[:, 5], logits[:, vocab - 2] = top, top
    got = ops.greedy(logits)
    assert got is not None
    ids, logprobs = got
    want = logits.argmax(dim=-1)
    assert torch.equal(ids, want)
    want_lp = torch.log_softmax(logits, dim=-1).gather(1, want[:, None])[:, 0]
    torch.testing.assert_close(logprobs, want_lp, rtol=1e-5, atol=1e-5)
    assert ops.greedy(logits.bfloat16()) is None  # float32 only: callers upcast first
