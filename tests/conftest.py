"""Shared fixtures: the real SmolLM2 model (engine and transformers oracle) and helpers.

TRITON_INTERPRET=1 is set here, on a machine without CUDA, before pytest imports any test
module: Triton reads it when a kernel is decorated, so the first module to import
radixserve.kernels (a kernel test, but just as well an engine or layer test collected before
it) fixes interpreted or compiled for the whole run. It is this process's only:
tests/child_env.py keeps it out of the engines and routers the tests start.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

# A CUDA (or ROCm) device needs its driver's device nodes; without any, torch cannot see one.
GPU_DEVICE_NODES = (Path("/dev/nvidiactl"), Path("/dev/kfd"))


def has_cuda() -> bool:
    """torch's answer (what the `gpu` cases go by), asked only where a GPU driver is present,
    so that a torch-free run on a CPU machine does not import torch for it."""
    if not any(node.exists() for node in GPU_DEVICE_NODES):
        return False
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


if not has_cuda():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# One co-located server and one prefill/decode pair, shared by the PD modules whose tests leave
# them as they found them (its docstring says which, and how they are grouped and stopped).
pytest_plugins = ("tests.engine.disaggregation.shared_pd",)

SMOLLM = "smollm2-135m"

PROMPTS = [
    "The capital of France is",
    "Write a haiku about the sea:",
    "def fibonacci(n):",
    "List three primary colors.",
    "Once upon a time, in a small village at the edge of a dark forest, there lived an old "
    "woodcutter and his daughter. Every morning",
    "Q: What is 12 times 7?\nA:",
    "Translate to French: I like apples.",
    "The quick brown fox jumps over the lazy dog. The quick brown fox jumps over the lazy dog. "
    "The quick brown fox jumps over the lazy dog. Explain what a pangram is:",
]


@pytest.fixture(scope="session")
def smollm_source() -> Any:
    from radixserve.engine.model_loader import ModelNotFoundError, resolve_model

    try:
        return resolve_model(SMOLLM)
    except ModelNotFoundError as exc:  # make test installs it; say so if it is missing
        pytest.fail(str(exc))


@pytest.fixture(scope="session")
def qwen3_tokenizer_dir() -> Path:
    """Qwen3's real tokenizer.json and tokenizer_config.json (its chat template), which
    `make install` fetches into the venv (scripts/fetch_qwen3_tokenizer.py)."""
    folder = Path(sys.prefix) / "share" / "qwen3-tokenizer"
    if not all((folder / name).is_file() for name in ("tokenizer.json", "tokenizer_config.json")):
        pytest.fail(
            f"Qwen3's tokenizer is not in {folder}: run `make install` "
            f"(or `{sys.executable} scripts/fetch_qwen3_tokenizer.py`)"
        )
    return folder


@pytest.fixture(scope="session")
def hf_smollm(smollm_source: Any) -> Any:
    """transformers' own Llama on the same GGUF, float32: the oracle for our outputs."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        str(smollm_source.directory), gguf_file=smollm_source.path.name, dtype=torch.float32
    )
    return model.eval()


@pytest.fixture(scope="session")
def hf_bf16(hf_smollm: Any) -> Any:
    """transformers' Llama on the same GGUF in bfloat16: the oracle of the bf16 tests
    (test_bf16_vs_transformers.py, test_same_answers.py). The float32 oracle's parameters cast
    to bfloat16: the model transformers loads with `dtype=torch.bfloat16`, bit for bit (its
    rotary `inv_freq` buffer stays float32 there too), without a second GGUF dequantization
    (~12 s)."""
    import copy

    import torch

    model = copy.deepcopy(hf_smollm)
    for param in model.parameters():
        param.data = param.data.to(torch.bfloat16)
    return model.eval()


@pytest.fixture(scope="session")
def smollm_engine() -> Iterator[Any]:
    from radixserve.engine import EngineCore as Engine

    # float32 pinned: the parity tests compare with transformers in float32, whatever the
    # serving default dtype is.
    engine = Engine(model_path=SMOLLM, max_total_tokens=16384, dtype="float32")
    yield engine
    engine.shutdown()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """`gpu`-marked tests skip without a CUDA device (torch is imported only if any was
    collected, so torch-free runs stay torch-free)."""
    gpu_items = [item for item in items if item.get_closest_marker("gpu")]
    if not gpu_items:
        return
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="gpu: needs a CUDA device")
    for item in gpu_items:
        item.add_marker(skip)
