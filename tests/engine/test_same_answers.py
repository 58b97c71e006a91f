"""Same answers whether or not a prompt's prefix is cached, whatever batch it runs in and
wherever its chunks end: 32 chat prompts answered greedily in bfloat16 by SmolLM2, on the
projection path of a CPU with AMX (our AMX kernel) and the one every other CPU takes
(`disable_amx_gemm`: oneDNN, or the row-invariant kernel in deterministic mode).

Each prompt is answered four ways: alone with nothing cached; alone again, its prompt cached
but for the last token; in a batch with 16 others (cache flushed); and alone in chunks of 16
tokens (cache flushed). The oracle for the answers is transformers in bfloat16 on the same
weights (teacher-forced: does its argmax pick our token at each step; near-ties flip under
bf16 rounding, so the agreement is printed and held to a floor, not to 1).

In every mode the four answers must be the same tokens. With --enable-deterministic-inference
they must agree bit for bit, log-probabilities included. In the default mode a repeated prompt
(cached) must get the same bits as its first, uncached run: its sampled token goes through the
same kernel row either way, over the same KV; a batch may move log-probabilities a little (the
shared-prefix AMX path sums in another order: up to 0.017 nats measured, docs/determinism.md),
which is printed.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch

from tests.conftest import SMOLLM
from tests.kernels.amx import cpu_has_amx

CHAT_PROMPTS = [
    "Name three colors.", "What is the capital of Italy?", "Give me a synonym for happy.",
    "How many legs does a spider have?", "Write one sentence about the ocean.",
    "What is 15 plus 27?", "List two fruits that are red.", "Who wrote Romeo and Juliet?",
    "What does a thermometer measure?", "Translate 'good morning' into Spanish.",
    "Describe a cat in five words.", "What is the boiling point of water in Celsius?",
    "Suggest a name for a pet goldfish.", "Why is the sky blue?", "What is photosynthesis?",
    "Name a planet in our solar system.", "How do you make a cup of tea?",
    "What is the opposite of cold?", "Give an example of a prime number.",
    "What language is spoken in Brazil?", "Tell me a fun fact about elephants.",
    "What is the largest ocean on Earth?", "Name three musical instruments.",
    "What season comes after winter?", "How many days are in a week?",
    "What is the main ingredient in bread?", "Write a short greeting for a birthday card.",
    "What do bees make?", "Name a famous painter.", "What is the square root of 81?",
    "Explain what a verb is.", "What is the freezing point of water in Fahrenheit?",
]  # fmt: skip
NEW_TOKENS = 8
BATCH_OTHERS = 16
CHUNK = 16
MIN_AGREEMENT = 0.9  # as test_bf16_vs_transformers.py

PATHS = {
    "amx": pytest.param(
        {}, marks=pytest.mark.skipif(not cpu_has_amx(), reason="CPU has no AMX-BF16")
    ),
    "no-amx": pytest.param({"disable_amx_gemm": True}),
}
MODES = {"default": {}, "deterministic": {"enable_deterministic_inference": True}}

Answer = tuple[list[int], list[float]]  # output ids, their log-probabilities


@pytest.fixture(scope="module", params=list(PATHS.values()), ids=list(PATHS))
def path_args(request: pytest.FixtureRequest) -> dict[str, Any]:
    return dict(request.param)


@pytest.fixture(params=list(MODES.values()), ids=list(MODES))
def engine(path_args: dict[str, Any], request: pytest.FixtureRequest) -> Iterator[Any]:
    from radixserve.engine import EngineCore

    args = {**path_args, **request.param}
    engine = EngineCore(model_path=SMOLLM, max_total_tokens=8192, dtype="bfloat16", **args)
    yield engine
    engine.shutdown()


def chat_ids(engine: Any) -> list[list[int]]:
    """The prompts through the model's chat template, tokenized as the engine does a text."""
    tok = engine.tokenizer
    texts = [
        tok.apply_chat_template(
            [{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True
        )
        for p in CHAT_PROMPTS
    ]
    return [list(tok.encode(t)) for t in texts]


def answer(engine: Any, prompts: list[list[int]]) -> list[Answer]:
    params = {"temperature": 0, "max_new_tokens": NEW_TOKENS, "ignore_eos": True}
    outs = engine.generate(input_ids=prompts, sampling_params=params, return_logprob=True)
    return [
        (o["output_ids"], [lp for lp, _t, _x in o["meta_info"]["output_token_logprobs"]])
        for o in outs
    ]


def four_ways(engine: Any, prompts: list[list[int]]) -> dict[str, list[Answer]]:
    """Each prompt's answer uncached, cached, in a batch of 17 and chunked."""
    runs: dict[str, list[Answer]] = {"uncached": [], "cached": []}
    for p in prompts:
        assert engine.scheduler.flush_cache()
        runs["uncached"].append(answer(engine, [p])[0])
        runs["cached"].append(answer(engine, [p])[0])
    assert engine.scheduler.flush_cache()
    runs["batch"] = []
    for start in range(0, len(prompts), BATCH_OTHERS + 1):
        runs["batch"] += answer(engine, prompts[start : start + BATCH_OTHERS + 1])
    chunked = engine.with_args(chunked_prefill_size=CHUNK)
    runs["chunked"] = []
    for p in prompts:
        assert chunked.scheduler.flush_cache()
        runs["chunked"].append(answer(chunked, [p])[0])
    return runs


def hf_agreement(model: Any, prompts: list[list[int]], answers: list[Answer]) -> tuple[int, int]:
    """How many of our tokens are transformers' argmax given the same history."""
    agree = total = 0
    for prompt, (output, _lps) in zip(prompts, answers, strict=True):
        with torch.no_grad():
            logits = model(torch.tensor([prompt + output])).logits[0, len(prompt) - 1 : -1]
        agree += sum(a == b for a, b in zip(logits.argmax(-1).tolist(), output, strict=True))
        total += len(output)
    return agree, total


def test_same_answers_uncached_cached_batched_chunked(
    engine: Any, hf_bf16: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    deterministic = engine.server_args.enable_deterministic_inference
    prompts = chat_ids(engine)
    runs = four_ways(engine, prompts)
    base = runs["uncached"]
    assert len(base) == len(CHAT_PROMPTS) >= 32
    report = []
    for name, got in runs.items():
        pairs = list(zip(CHAT_PROMPTS, base, got, strict=True))
        differ = [p for p, a, b in pairs if a[0] != b[0]]
        bits_differ = [p for p, a, b in pairs if a != b]
        report.append(f"{name} {len(differ)} answers / {len(bits_differ)} logprob rows differ")
        assert not differ, f"{name}: answers differ from the uncached run's: {differ}"
        if deterministic or name == "cached":
            assert not bits_differ, f"{name}: not the uncached run's bits: {bits_differ}"
    agree, total = hf_agreement(hf_bf16, prompts, base)
    with capsys.disabled():
        path = "no-amx" if engine.server_args.disable_amx_gemm else "amx"
        settings = engine.server_args.effective_settings()
        print(f"\n{path} {settings}: vs uncached: {'; '.join(report)}; "
              f"greedy agreement with transformers bf16 {agree}/{total}")  # fmt: skip
    assert agree / total >= MIN_AGREEMENT
