"""SmolLM2 in bfloat16 (the CPU default where the CPU has AVX-512 BF16 / AMX, with the grouped
attention backend) against transformers in bfloat16 on the same GGUF weights.

Teacher-forced: our greedy continuation of each prompt is fed to transformers in one forward;
at every generated position we compare our reported log-probability of the chosen token with
transformers' (bf16 logits differ by rounding in every layer, so within LOGPROB_TOL nats),
and count how often our token is also transformers' argmax there (greedy agreement, printed;
near-ties flip under bf16 rounding, so it must be at least MIN_AGREEMENT, not 1).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch

from tests.conftest import PROMPTS, SMOLLM

NEW_TOKENS = 12
PROMPT_COUNT = 4
# nats: bf16 rounds differently in every layer on each side (transformers casts its
# dequantised GGUF weights per matmul), so single positions move by a few tenths; the mean
# stays small. float32 runs agree to ~1e-4 (test_smollm_vs_transformers.py).
MAX_LOGPROB_TOL = 0.5
MEAN_LOGPROB_TOL = 0.1
MIN_AGREEMENT = 0.9


@pytest.fixture(scope="module")
def bf16_engine() -> Iterator[Any]:
    from radixserve.engine import EngineCore

    engine = EngineCore(model_path=SMOLLM, max_total_tokens=4096, dtype="bfloat16")
    yield engine
    engine.shutdown()


def hf_logprobs(model: Any, prompt: list[int], output: list[int]) -> tuple[list[float], list[int]]:
    """transformers' log-prob of each output token given everything before it, and its argmax."""
    ids = torch.tensor([prompt + output])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1].float()
    logprobs = torch.log_softmax(logits, dim=-1)
    chosen = logprobs.gather(1, torch.tensor(output).unsqueeze(1)).squeeze(1)
    return chosen.tolist(), logits.argmax(dim=-1).tolist()


def test_bf16_greedy_and_logprobs_match_transformers_bf16(
    bf16_engine: Any, hf_bf16: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    assert bf16_engine.server_args.resolved_attention_backend == "grouped"
    params = {"temperature": 0, "max_new_tokens": NEW_TOKENS, "ignore_eos": True}
    prompts = PROMPTS[:PROMPT_COUNT]
    outs = bf16_engine.generate(prompt=prompts, sampling_params=params, return_logprob=True)
    agree = 0
    deltas: list[float] = []
    for text, out in zip(prompts, outs, strict=True):
        prompt = list(bf16_engine.tokenizer.encode(text))
        ours = [lp for lp, _tok, _txt in out["meta_info"]["output_token_logprobs"]]
        theirs, argmax = hf_logprobs(hf_bf16, prompt, out["output_ids"])
        deltas += [abs(a - b) for a, b in zip(ours, theirs, strict=True)]
        agree += sum(a == b for a, b in zip(argmax, out["output_ids"], strict=True))
    worst, mean = max(deltas), sum(deltas) / len(deltas)
    with capsys.disabled():
        print(
            f"\nbf16 vs transformers bf16: greedy agreement {agree}/{len(deltas)}, "
            f"|Δ logprob| max {worst:.4f} mean {mean:.4f} nats"
        )
    assert worst <= MAX_LOGPROB_TOL
    assert mean <= MEAN_LOGPROB_TOL
    assert agree / len(deltas) >= MIN_AGREEMENT
