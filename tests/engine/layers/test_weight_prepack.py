"""CPU bf16 weight prepacking (layers/parallel_linear.py) against F.linear on the plain weight.

The oracle is torch's own F.linear on the weight before packing. Packed for oneDNN, the op
runs the same oneDNN kernels, so results must be bit-identical, for every batch size (the
layout is packed for one), strided inputs (the views the models pass) and empty batches.
Packed for the AMX kernel, each output must lie within half a bfloat16 ulp of F.linear in
float32 plus the float32 reordering bound (the kernel's own tests: tests/kernels). The real
SmolLM2 engine must give the same greedy tokens packed for oneDNN as unpacked, and with the
AMX kernel the same tokens on these prompts too. The AMX cases skip only where the CPU has no
AMX-BF16 (the oneDNN ones run everywhere, and check that a CPU without oneDNN's bf16 path keeps
the plain weight); where it has, a kernel that does not build fails
them (`tests/kernels/amx.py`).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from radixserve.engine.distributed import GroupHandle
from radixserve.engine.layers import parallel_linear
from radixserve.engine.layers.parallel_linear import (
    ColumnParallelLinear,
    QKVParallelLinear,
    RowParallelLinear,
    onednn_bf16_supported,
)
from radixserve.engine.layers.vocab_parallel import ParallelLMHead, VocabParallelEmbedding
from radixserve.kernels.cpu.amx_gemm import AmxWeight
from radixserve.kernels.cpu.rowwise_gemm import (
    RowwiseWeight,
    build_rowwise_gemm,
    load_rowwise_gemm,
)
from tests.kernels.amx import amx_gemm_or_none, amx_gemm_or_skip

pytestmark = pytest.mark.skipif(
    not torch.backends.mkldnn.is_available(), reason="torch built without oneDNN"
)


def _filled(module: torch.nn.Module, seed: int, dtype: torch.dtype) -> torch.nn.Module:
    g = torch.Generator().manual_seed(seed)
    for p in module.parameters():
        p.data = torch.randn(p.shape, generator=g).to(dtype)
    return module


def _layers(row_bias: bool = True) -> list[ColumnParallelLinear | RowParallelLinear]:
    single = GroupHandle.single()
    return [
        _filled(ColumnParallelLinear(64, [96, 96], False, single), 1, torch.bfloat16),
        _filled(QKVParallelLinear(64, 16, 4, 2, True, single), 2, torch.bfloat16),
        _filled(RowParallelLinear(96, 64, row_bias, single), 3, torch.bfloat16),
    ]


def _expected(
    layer: torch.nn.Module, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    if isinstance(layer, RowParallelLinear):  # the bias is added after the reduction
        return F.linear(x, weight) + bias if bias is not None else F.linear(x, weight)
    return F.linear(x, weight, bias)


@pytest.mark.parametrize("rows", [0, 1, 7, 32, 256, 700])
@pytest.mark.parametrize("cpu", ["this", "avx2_only"])
def test_prepacked_projections_equal_f_linear_bit_for_bit(
    rows: int, cpu: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Packed for oneDNN where its bf16 path runs on this CPU; where it does not (an AVX2-only
    CPU, emulated by the second case: torch's reorder raises there) the weight stays as it
    was, for F.linear."""
    if cpu == "avx2_only":
        monkeypatch.setattr(parallel_linear, "onednn_bf16_supported", lambda: False)
    packs = cpu == "this" and onednn_bf16_supported()
    for layer in _layers():
        weight = layer.weight.data.clone()
        bias = layer.bias.data.clone() if layer.bias is not None else None
        wide = torch.randn(rows, weight.shape[1] + 5).to(torch.bfloat16)
        x = wide[:, : weight.shape[1]]  # a strided view, as a split projection hands over
        want = _expected(layer, x, weight, bias)
        assert layer.prepack_cpu() == ("onednn" if packs else None)
        if packs:
            assert layer.weight is None and layer.packed is not None
        else:
            assert layer.packed is None and torch.equal(layer.weight.data, weight)
        assert torch.equal(layer(x), want)
        assert layer.prepack_cpu() is None  # once


@pytest.mark.parametrize("rows", [0, 1, 7, 32, 256, 700])
@pytest.mark.parametrize("kernel", ["amx", "rowwise"])
def test_kernel_packed_projections_match_float32_f_linear(rows: int, kernel: str) -> None:
    """The AMX kernel, or the row-invariant one (deterministic inference: passed as the second
    kernel, it packs what AMX does not take)."""
    amx = amx_gemm_or_skip() if kernel == "amx" else None
    rowwise = build_rowwise_gemm() if kernel == "rowwise" else None
    packed_type = AmxWeight if kernel == "amx" else RowwiseWeight
    # The row-parallel bias is added by torch after the reduction (a second rounding), so that
    # layer goes without one here; the column layers' bias is the kernel's.
    for layer in _layers(row_bias=False):
        weight = layer.weight.data.clone()
        bias = layer.bias.data.float() if layer.bias is not None else None
        x = torch.randn(rows, weight.shape[1] + 5).to(torch.bfloat16)[:, : weight.shape[1]]
        assert layer.prepack_cpu(amx, rowwise) == kernel
        assert isinstance(layer.packed, packed_type)
        want = F.linear(x.float(), weight.float(), bias)
        spread = F.linear(x.float().abs(), weight.float().abs())
        if bias is not None:
            spread = spread + bias.abs()
        bound = want.abs() * 2.0**-8 + spread * 2.0**-20 + 1e-30
        assert bool(((layer(x).float() - want).abs() <= bound).all())


@pytest.mark.parametrize("with_amx", [False, True], ids=["onednn", "amx"])
def test_float32_and_released_weights_are_left_alone(with_amx: bool) -> None:
    amx = amx_gemm_or_skip() if with_amx else None
    layer = _filled(ColumnParallelLinear(8, [8], False, GroupHandle.single()), 4, torch.float32)
    assert layer.prepack_cpu(amx) is None and layer.weight is not None  # bf16 only
    packed = _filled(RowParallelLinear(8, 8, False, GroupHandle.single()), 5, torch.bfloat16)
    if not onednn_bf16_supported():  # nothing packs 8 columns: the weight stays
        assert packed.prepack_cpu(amx) is None and packed.weight is not None
        return
    assert packed.prepack_cpu(amx) == "onednn"  # 8 columns: not the AMX kernel's
    with pytest.raises(ValueError, match="prepacked"):
        packed.load_full(torch.zeros(8, 8), is_bias=False)


def test_smollm2_greedy_tokens_are_the_same_packed_and_unpacked() -> None:
    from radixserve.engine import EngineCore
    from tests.conftest import PROMPTS, SMOLLM

    amx = amx_gemm_or_none() is not None  # where the CPU has AMX-BF16 it must build
    onednn = torch.Tensor if onednn_bf16_supported() else None  # AVX2-only: not packed
    no_amx = RowwiseWeight if load_rowwise_gemm() is not None else onednn
    runs = {  # name: (flags, the packed layout every projection must have)
        "plain": ({"disable_weight_prepack": True}, None),
        "onednn": ({"disable_amx_gemm": True, "disable_rowwise_gemm": True}, onednn),
        "no_amx": ({"disable_amx_gemm": True}, no_amx),
        "default": ({}, AmxWeight if amx else no_amx),
    }
    outputs = {}
    for name, (flags, layout) in runs.items():
        engine = EngineCore(model_path=SMOLLM, max_total_tokens=2048, dtype="bfloat16", **flags)
        try:
            params = {"temperature": 0.0, "max_new_tokens": 8}
            outputs[name] = [engine.generate(p, params)["output_ids"] for p in PROMPTS[:3]]
            projections = [
                m
                for m in engine.runner.model.modules()
                if isinstance(m, (ColumnParallelLinear, RowParallelLinear))
            ]
            if layout is None:
                assert all(m.packed is None for m in projections)
            else:
                assert all(isinstance(m.packed, layout) for m in projections)
        finally:
            engine.shutdown()
    assert outputs["onednn"] == outputs["plain"]  # the same oneDNN kernels
    if amx:  # the AMX kernel sums in oneDNN's order for these shapes
        assert outputs["default"] == outputs["plain"]
    # The row-invariant kernel sums in another order: bf16 near-ties may flip, rarely
    tokens = [t for p in outputs["plain"] for t in p]
    rowwise = [t for p in outputs["no_amx"] for t in p]
    assert sum(a == b for a, b in zip(tokens, rowwise, strict=True)) >= 0.9 * len(tokens)


@pytest.mark.parametrize("kernel", ["amx", "rowwise", "none"])
@pytest.mark.parametrize("tied", [True, False])
def test_packed_lm_head_writes_float32_logits_and_keeps_only_a_tied_matrix(
    tied: bool, kernel: str
) -> None:
    """Whichever way the CPU head multiplies (AMX kernel, row-invariant kernel, or a float32
    copy where neither builds), its logits are float32 sums of the bf16 products, not rounded
    to bf16 (where a logit near 16-32 moves in steps of 0.125 and near-ties are common)."""
    amx = amx_gemm_or_skip() if kernel == "amx" else None
    rowwise = build_rowwise_gemm() if kernel == "rowwise" else None
    single = GroupHandle.single()
    embed = _filled(VocabParallelEmbedding(96, 64, single), 6, torch.bfloat16)
    head = ParallelLMHead(96, 64, single, embed if tied else None)
    if not tied:
        head = _filled(head, 7, torch.bfloat16)
    weight = head.weight.data.clone()
    hidden = torch.randn(33, 64).to(torch.bfloat16)
    layout = {"amx": "amx", "rowwise": "rowwise", "none": "float32"}[kernel]
    assert head.prepack_cpu(amx, rowwise) == layout and head.prepack_cpu(amx, rowwise) is None
    want = F.linear(hidden.float(), weight.float())
    bound = F.linear(hidden.float().abs(), weight.float().abs()) * 2.0**-20  # reordering only
    got = head(hidden)
    assert got.dtype == torch.float32
    assert bool(((got - want).abs() <= bound + 1e-30).all())
    # tied: the embedding still reads the same matrix; untied: no second copy is kept
    assert (head.weight is embed.weight) if tied else (head.weight is None)
    assert torch.equal(embed(torch.tensor([0, 95])), embed.weight.data[[0, 95]])
    with pytest.raises(ValueError, match="prepacked"):
        head.load_full(torch.zeros(96, 64))
