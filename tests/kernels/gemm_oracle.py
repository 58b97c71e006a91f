"""The oracle of the packed bf16 GEMM kernels' tests (test_cpu_amx_gemm.py,
test_cpu_rowwise_gemm.py): torch's F.linear on the same bfloat16 values upcast to float32
(exact products, float32 sums). A kernel sums in float32 in another order and rounds once, so
each element must lie within half a bfloat16 ulp of the oracle (where it writes bf16) plus the
float32 reordering bound, 2⁻²⁰ of Σ|x·w|."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def gemm_case(
    n: int, k: int, rows: int, seed: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(weight [n, k], x [rows, k] as a strided view, as a split projection hands over, bias
    [n]), bfloat16, from `seed`."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g).to(torch.bfloat16)
    wide = torch.randn(rows, k + 24, generator=g).to(torch.bfloat16)
    bias = torch.randn(n, generator=g).to(torch.bfloat16)
    return w, wide[:, 8 : 8 + k], bias


def assert_within_bound(
    got: torch.Tensor, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None
) -> None:
    want = F.linear(x.float(), w.float(), b.float() if b is not None else None)
    spread = F.linear(x.float().abs(), w.float().abs())
    if b is not None:
        spread = spread + b.float().abs()
    ulp = 2.0**-8 if got.dtype == torch.bfloat16 else 0.0  # half an ulp of the rounding
    bound = want.abs() * ulp + spread * 2.0**-20 + 1e-30
    diff = (got.float() - want).abs()
    assert bool((diff <= bound).all()), f"max excess {(diff - bound).max().item()}"
