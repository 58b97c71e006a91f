"""The row-invariant projection kernel (kernels/cpu/rowwise_gemm.cpp) against F.linear in
float32, and its one promise the oracle can't see: a row's result is the same bits whatever
rows share its call.

The oracle is torch's F.linear on the same bfloat16 values upcast to float32 (exact products,
float32 sums). The kernel sums in float32 in K order and rounds once, so each element lies
within half a bfloat16 ulp of the oracle plus the float32 reordering bound (2⁻²⁰ of Σ|x·w|).
It runs on every CPU with a compiler, so these tests skip nowhere: a build failure fails them.
Its three code paths (AVX512-BF16, AVX-512 FMA, scalar) are each built here, for this CPU and
for older x86-64 targets, and held to the same oracle and invariance.
"""

from __future__ import annotations

import platform

import pytest
import torch

from radixserve.engine.configs.cpu_features import cpu_flags
from radixserve.kernels.cpu.rowwise_gemm import RowwiseGemm, RowwiseWeight, build_rowwise_gemm
from tests.kernels.gemm_oracle import assert_within_bound, gemm_case

ROWS = [0, 1, 7, 8, 9, 33, 300]  # around the kernel's 8-row groups
SHAPES = [(16, 32), (5, 1), (37, 19), (48, 64), (960, 576)]  # odd K, N off the 16-column blocks


@pytest.fixture(scope="module")
def kernel() -> RowwiseGemm:
    return build_rowwise_gemm()


@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize(("n", "k"), SHAPES)
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32])
def test_linear_matches_float32_oracle(
    kernel: RowwiseGemm, rows: int, n: int, k: int, out_dtype: torch.dtype
) -> None:
    w, x, bias = gemm_case(n, k, rows, seed=rows * 1000 + n + k)
    packed = kernel.pack(w)
    assert isinstance(packed, RowwiseWeight)
    got = packed.linear(x, bias, out_dtype)
    assert got.shape == (rows, n) and got.dtype == out_dtype
    assert_within_bound(got, x, w, bias)


@pytest.mark.parametrize(("n", "k"), [(960, 576), (37, 19)])
def test_a_rows_result_does_not_depend_on_the_other_rows(kernel: RowwiseGemm, n: int, k: int):
    """Each row alone, each prefix of the batch, and the batch reversed give the same bits
    (oneDNN and MKL do not promise this: they block by the call's shape)."""
    w, x, bias = gemm_case(n, k, 70, seed=7)
    packed = kernel.pack(w)
    assert packed is not None
    full = packed.linear(x, bias, torch.float32)
    for m in (1, 2, 7, 8, 9, 16, 17, 33, 69):
        assert torch.equal(packed.linear(x[:m], bias, torch.float32), full[:m]), m
        assert torch.equal(packed.linear(x[m : m + 1], bias, torch.float32)[0], full[m]), m
    assert torch.equal(packed.linear(x.flip(0), bias, torch.float32).flip(0), full)


def test_3d_input_and_threads(kernel: RowwiseGemm) -> None:
    """A [2, 5, k] input is its 10 rows; one thread gives the same bits as two."""
    w, x, bias = gemm_case(48, 64, 10, seed=3)
    packed = kernel.pack(w)
    assert packed is not None
    flat = packed.linear(x, bias)
    assert torch.equal(packed.linear(x.reshape(2, 5, 64), bias).reshape(10, 48), flat)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert torch.equal(packed.linear(x, bias), flat)
    finally:
        torch.set_num_threads(threads)


def test_pack_refuses_and_linear_rejects_with_a_clear_error(kernel: RowwiseGemm) -> None:
    assert kernel.pack(torch.randn(16, 32)) is None  # float32
    assert kernel.pack(torch.randn(16, 32).to(torch.bfloat16).t()) is None  # column-major
    assert kernel.pack(torch.empty(0, 32, dtype=torch.bfloat16)) is None
    packed = kernel.pack(torch.randn(16, 32).to(torch.bfloat16))
    assert packed is not None
    with pytest.raises(ValueError, match="bfloat16 \\[..., 32\\]"):
        packed.linear(torch.randn(3, 32))
    with pytest.raises(ValueError, match="bfloat16 \\[..., 32\\]"):
        packed.linear(torch.randn(3, 31).to(torch.bfloat16))
    with pytest.raises(ValueError, match="bias"):
        packed.linear(torch.randn(3, 32).to(torch.bfloat16), torch.randn(15).to(torch.bfloat16))
    with pytest.raises(ValueError, match="float16"):
        packed.linear(torch.randn(3, 32).to(torch.bfloat16), out_dtype=torch.float16)


# Builds for CPUs other than this one: AVX-512 without BF16, AVX2 (the scalar path,
# vectorised by the compiler) and baseline x86-64. Each runs on any newer x86-64 CPU.
OTHER_TARGETS = {
    "avx512-fma": ("-march=native", "-mno-avx512bf16"),
    "x86-64-v3": ("-march=x86-64-v3",),
    "x86-64": ("-march=x86-64",),
}


@pytest.mark.skipif(platform.machine() != "x86_64", reason="x86-64 targets")
@pytest.mark.parametrize("arch", list(OTHER_TARGETS.values()), ids=list(OTHER_TARGETS))
def test_every_code_path_is_exact_and_row_invariant(arch: tuple[str, ...]) -> None:
    """The builds of CPUs without AVX512-BF16 or without AVX-512 (which -march=native does not
    produce here) meet the same oracle, and a row's bits still ignore the other rows (the
    scalar path lost that once under -ffast-math: `+=` compiled differently per row count)."""
    if "avx512" in arch[-1] and "avx512f" not in cpu_flags():
        pytest.skip("this CPU has no AVX-512: the native build is already the scalar path")
    kernel = build_rowwise_gemm(arch)
    for n, k, rows in [(960, 576, 70), (37, 19, 33), (5, 1, 9)]:
        w, x, bias = gemm_case(n, k, rows, seed=n + k)
        packed = kernel.pack(w)
        assert packed is not None
        for out_dtype in (torch.bfloat16, torch.float32):
            assert_within_bound(packed.linear(x, bias, out_dtype), x, w, bias)
        full = packed.linear(x, bias, torch.float32)
        for m in range(1, rows):
            assert torch.equal(packed.linear(x[:m], bias, torch.float32), full[:m]), m
            assert torch.equal(packed.linear(x[m : m + 1], bias, torch.float32)[0], full[m]), m
