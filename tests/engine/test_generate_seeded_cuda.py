"""Seeded sampling on CUDA: each request's generator lives on the runner's device, and a seed
reproduces its samples (the `gpu` test skips without a CUDA device)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_seeded_sampling_reproduces_on_cuda(tmp_path: Path) -> None:
    from radixserve.engine import EngineCore
    from radixserve.engine.entrypoints.request_builder import OutputOptions, Prompt, build_inputs
    from tests.engine.models.tiny import random_prompts, save_tiny

    save_tiny("llama", tmp_path, tie_word_embeddings=True)
    prompts = random_prompts((7, 11), seed=3)
    hot = {"temperature": 1.0, "top_k": 50, "max_new_tokens": 12, "ignore_eos": True}
    engine = EngineCore(model_path=str(tmp_path), device="cuda", max_total_tokens=4096)
    try:
        (inp,) = build_inputs(
            [Prompt(None, prompts[0])],
            [{**hot, "sampling_seed": 1}],
            engine.limits,
            OutputOptions(),
        )
        generator = engine.core.make_req(inp.tokenized(engine.tokenizer.eos_token_id)).generator
        assert generator is not None and generator.device.type == "cuda"

        def run(seed: int) -> list[list[int]]:
            params = {**hot, "sampling_seed": seed}
            outs = engine.generate(input_ids=prompts, sampling_params=params)
            return [o["output_ids"] for o in outs]

        first, again, other = run(1), run(1), run(2)
        assert first == again
        assert first != other
        engine.scheduler.check_memory_invariant()
    finally:
        engine.shutdown()
