"""Greedy SmolLM2-135M (GGUF, float32): token-for-token equal to transformers on the same file."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tests.conftest import PROMPTS

NEW_TOKENS = 24  # transformers steps one token at ~75 ms here: 8 prompts × 24 is its whole cost


def hf_greedy(model: Any, ids: list[int], n: int) -> list[int]:
    """Plain greedy loop with HF's KV cache; EOS does not stop it (we compare all n tokens)."""
    out: list[int] = []
    with torch.no_grad():
        res = model(torch.tensor([ids]), use_cache=True)
        for _ in range(n):
            tok = int(res.logits[0, -1].argmax())
            out.append(tok)
            res = model(torch.tensor([[tok]]), past_key_values=res.past_key_values, use_cache=True)
    return out


@pytest.fixture(scope="module")
def reference(hf_smollm: Any, smollm_engine: Any) -> list[list[int]]:
    ids = [smollm_engine.tokenizer.encode(p) for p in PROMPTS]
    return [hf_greedy(hf_smollm, x, NEW_TOKENS) for x in ids]


GREEDY = {"temperature": 0, "max_new_tokens": NEW_TOKENS, "ignore_eos": True}


def test_batch_greedy_matches_transformers(smollm_engine: Any, reference: list[list[int]]) -> None:
    outs = smollm_engine.generate(prompt=PROMPTS, sampling_params=GREEDY)
    assert [o["output_ids"] for o in outs] == reference


def test_page_size_16_matches_transformers(smollm_engine: Any, reference: list[list[int]]) -> None:
    engine = smollm_engine.with_args(page_size=16, max_total_tokens=8192)
    outs = engine.generate(prompt=PROMPTS, sampling_params=GREEDY)
    assert [o["output_ids"] for o in outs] == reference
    engine.scheduler.check_memory_invariant()


def test_chunked_prefill_matches_transformers(
    smollm_engine: Any, reference: list[list[int]]
) -> None:
    engine = smollm_engine.with_args(chunked_prefill_size=16, max_total_tokens=8192)
    outs = engine.generate(prompt=PROMPTS, sampling_params=GREEDY)
    assert [o["output_ids"] for o in outs] == reference
