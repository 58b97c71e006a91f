"""CPU bf16 weight prepacking (layers/parallel_linear.py) against F.linear on the plain weight.

The oracle is torch's own F.linear on the weight before packing; the packed op runs the same
oneDNN kernels, so results must be bit-identical, for every batch size (the layout is packed
for one), strided inputs (the views the models pass) and empty batches. An end-to-end run of
the real SmolLM2 engine with and without prepacking must produce the same greedy tokens.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from radixserve.engine.distributed import GroupHandle
from radixserve.engine.layers.parallel_linear import (
    ColumnParallelLinear,
    QKVParallelLinear,
    RowParallelLinear,
)

pytestmark = pytest.mark.skipif(
    not torch.backends.mkldnn.is_available(), reason="torch built without oneDNN"
)


def _filled(module: torch.nn.Module, seed: int, dtype: torch.dtype) -> torch.nn.Module:
    g = torch.Generator().manual_seed(seed)
    for p in module.parameters():
        p.data = torch.randn(p.shape, generator=g).to(dtype)
    return module


@pytest.mark.parametrize("rows", [0, 1, 7, 32, 256, 700])
def test_prepacked_projections_equal_f_linear_bit_for_bit(rows: int) -> None:
    single = GroupHandle.single()
    layers = [
        _filled(ColumnParallelLinear(64, [96, 96], False, single), 1, torch.bfloat16),
        _filled(QKVParallelLinear(64, 16, 4, 2, True, single), 2, torch.bfloat16),
        _filled(RowParallelLinear(96, 64, True, single), 3, torch.bfloat16),
    ]
    for layer in layers:
        weight = layer.weight.data.clone()
        bias = layer.bias.data.clone() if layer.bias is not None else None
        wide = torch.randn(rows, weight.shape[1] + 5).to(torch.bfloat16)
        x = wide[:, : weight.shape[1]]  # a strided view, as a split projection hands over
        if isinstance(layer, RowParallelLinear):  # the bias is added after the reduction
            want = F.linear(x, weight) + bias if bias is not None else F.linear(x, weight)
        else:
            want = F.linear(x, weight, bias)
        assert layer.prepack_cpu()
        assert layer.weight is None and layer.packed is not None
        assert torch.equal(layer(x), want)
        assert not layer.prepack_cpu()  # once


def test_float32_and_released_weights_are_left_alone() -> None:
    layer = _filled(ColumnParallelLinear(8, [8], False, GroupHandle.single()), 4, torch.float32)
    assert not layer.prepack_cpu() and layer.weight is not None  # bf16 only
    packed = _filled(RowParallelLinear(8, 8, False, GroupHandle.single()), 5, torch.bfloat16)
    assert packed.prepack_cpu()
    with pytest.raises(ValueError, match="prepacked"):
        packed.load_full(torch.zeros(8, 8), is_bias=False)


def test_smollm2_greedy_tokens_are_the_same_with_and_without_prepacking() -> None:
    from radixserve.engine import EngineCore
    from tests.conftest import PROMPTS, SMOLLM

    outputs = []
    for disable in (False, True):
        engine = EngineCore(
            model_path=SMOLLM, max_total_tokens=2048, dtype="bfloat16",
            disable_weight_prepack=disable,
        )  # fmt: skip
        try:
            params = {"temperature": 0.0, "max_new_tokens": 8}
            outputs.append([engine.generate(p, params)["output_ids"] for p in PROMPTS[:3]])
            projections = [m for m in engine.runner.model.modules() if hasattr(m, "packed")]
            assert all((m.packed is not None) != disable for m in projections)
        finally:
            engine.shutdown()
    assert outputs[0] == outputs[1]
