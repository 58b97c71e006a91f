"""The expert distribution recorder (`--expert-distribution-recorder-mode stat`) through its
SGLang endpoints on the multi-process Engine: the tokens each MoE layer routed to each expert
while recording are the experts transformers' own routers choose for the same prompts (tiny
random-weight Qwen2-MoE, float32, prompts prefilled once each); nothing is counted outside
start/stop; the dump is also the `.pt` file SGLang's stat mode writes; with the recorder off
the endpoints refuse, naming the flag."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from tests.engine.models.tiny import random_prompts, save_tiny

PREFILL_ONLY = {"max_new_tokens": 1, "temperature": 0}


def routed_by_transformers(hf: Any, prompts: list[list[int]]) -> torch.Tensor:
    """[layers, experts]: top-k ids of each layer's router, counted over every prompt token."""
    layers, experts = hf.model.layers, hf.config.num_experts
    counts = torch.zeros(len(layers), experts, dtype=torch.int64)

    def count(layer: int) -> Any:
        def hook(_module: Any, _inputs: Any, out: Any) -> None:  # out: logits, weights, ids
            counts[layer] += torch.bincount(out[2].flatten(), minlength=experts)

        return hook

    hooks = [layer.mlp.gate.register_forward_hook(count(i)) for i, layer in enumerate(layers)]
    with torch.no_grad():
        for ids in prompts:
            hf(torch.tensor([ids]))
    for h in hooks:
        h.remove()
    return counts


def test_recorded_counts_are_the_routers_choices(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from radixserve.engine import Engine

    folder = tmp_path / "qwen2-moe"
    hf = save_tiny("qwen2_moe", folder, seed=3)
    prompts = random_prompts((12, 30, 7), seed=1)
    monkeypatch.setenv("SGLANG_EXPERT_DISTRIBUTION_RECORDER_DIR", str(tmp_path / "dumps"))
    args = {"dtype": "float32", "expert_distribution_recorder_mode": "stat"}
    with Engine(model_path=str(folder), **args) as engine:
        engine.generate(input_ids=prompts, sampling_params=PREFILL_ONLY)  # not recorded
        engine.flush_cache()  # the recorded pass computes every prompt token again
        engine.expert_distribution("start")
        engine.generate(input_ids=prompts, sampling_params=PREFILL_ONLY)
        engine.expert_distribution("stop")
        engine.flush_cache()
        engine.generate(input_ids=prompts, sampling_params=PREFILL_ONLY)  # stopped
        dump = engine.expert_distribution("dump")
        again = engine.expert_distribution("dump")  # a dump resets
    passes = torch.tensor(dump["logical_count"])
    assert passes.shape[1:] == (2, 8) and passes.shape[0] >= 1
    assert torch.equal(passes.sum(0), routed_by_transformers(hf, prompts))
    assert again["logical_count"] == []
    saved = torch.load(dump["path"])
    assert torch.equal(saved["logical_count"], passes)


def test_the_endpoints_refuse_without_the_recorder() -> None:
    """A server started without the flag (no recorder) answers every action with the flag's
    name (the HTTP routes turn it into a 400); an unknown action is named too."""
    from radixserve.engine.scheduler.expert_distribution_control import expert_distribution

    for action in ("start", "stop", "dump"):
        out = expert_distribution(None, action, 0)
        assert not out.success and "--expert-distribution-recorder-mode stat" in out.message
    assert "action" in expert_distribution(None, "pause", 0).message
