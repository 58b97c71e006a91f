"""GPU-only paths: the FlashInfer backend against the torch reference, CUDA-graph decode
against eager decode. Both skip without a CUDA device (and the first without flashinfer),
saying which; `scripts/gpu_check.sh` runs them on a borrowed GPU.

The oracle of the FlashInfer case is the torch backend on the same GPU and weights (float16:
FlashInfer has no float32 kernels); the oracle of the graph case is the same engine with
`--disable-cuda-graph` (float32, triton backend), whose tokens a replay must reproduce.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.engine.models.tiny import random_prompts, save_tiny

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]
NEW_TOKENS = 8
GREEDY = {"temperature": 0, "max_new_tokens": NEW_TOKENS, "ignore_eos": True}


def generate(folder: Path, prompts: list[list[int]], **args: Any) -> tuple[list[Any], Any]:
    """Greedy outputs and the engine's graph runner (None when graphs are off)."""
    from radixserve.engine import EngineCore

    engine = EngineCore(model_path=str(folder), device="cuda", max_total_tokens=4096, **args)
    try:
        outs = engine.generate(input_ids=prompts, sampling_params=GREEDY)
        engine.scheduler.check_memory_invariant()
        return [o["output_ids"] for o in outs], engine.runner.graph_runner
    finally:
        engine.shutdown()


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("gpu-llama")
    save_tiny("llama", folder, seed=9)
    return folder


@pytest.mark.skipif(
    importlib.util.find_spec("flashinfer") is None, reason="needs flashinfer (not installed)"
)
@pytest.mark.parametrize("page_size", [1, 16])
def test_flashinfer_greedy_equals_torch(tiny_folder: Path, page_size: int) -> None:
    prompts = random_prompts((40, 9, 23, 3), seed=4)
    args = {"dtype": "float16", "page_size": page_size, "chunked_prefill_size": 16}
    expected, _ = generate(tiny_folder, prompts, attention_backend="torch", **args)
    got, _ = generate(tiny_folder, prompts, attention_backend="flashinfer", **args)
    assert got == expected


def test_cuda_graph_replay_equals_eager(tiny_folder: Path) -> None:
    # 5 requests decoding together: replayed from the bs-8 graph with 3 padding rows
    prompts = random_prompts((12, 30, 7, 19, 25), seed=6)
    args = {"dtype": "float32", "attention_backend": "triton", "cuda_graph_max_bs": 16}
    eager, no_graphs = generate(tiny_folder, prompts, disable_cuda_graph=True, **args)
    graphed, runner = generate(tiny_folder, prompts, **args)
    assert no_graphs is None and runner is not None
    assert runner.sizes == [1, 2, 4, 8, 16]
    assert graphed == eager
