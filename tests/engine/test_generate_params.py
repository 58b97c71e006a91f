"""End-to-end `Engine.generate` on SmolLM2-135M: sampling parameters, validation and aborts.

Every test compares against a control run so that it would fail if the parameter under test
were silently ignored. Generation lengths are kept short: the model runs on CPU.
"""

from __future__ import annotations

from typing import Any

import pytest

PROMPT = "The capital of France is"
N_TOKENS = 24
GREEDY = {"temperature": 0, "max_new_tokens": N_TOKENS}
HOT = {"temperature": 1.5, "max_new_tokens": 16}


def repeats(ids: list[int]) -> int:
    """How many output tokens are repeats of an earlier output token."""
    return len(ids) - len(set(ids))


@pytest.fixture(scope="module")
def greedy_ids(smollm_engine: Any) -> list[int]:
    out = smollm_engine.generate(prompt=PROMPT, sampling_params=GREEDY)
    assert out["meta_info"]["finish_reason"] == {"type": "length", "length": N_TOKENS}
    return out["output_ids"]


# ---- temperature / top-k / top-p / min-p / seed -----------------------------------------------


def test_greedy_equivalents(smollm_engine: Any, greedy_ids: list[int]) -> None:
    """temperature 0, top_k=1, top_p→0 and min_p=1 all take the argmax; plain sampling does not."""
    cases = {
        "top_k=1 @ T=1": {"temperature": 1.0, "top_k": 1},
        "top_k=1 @ T=1.5": {"temperature": 1.5, "top_k": 1, "sampling_seed": 3},
        "top_p=1e-6": {"temperature": 1.0, "top_p": 1e-6, "sampling_seed": 3},
        "min_p=1": {"temperature": 1.0, "min_p": 1.0, "sampling_seed": 3},
        # Controls: the same seed without a filter must leave greedy, or the cases prove nothing.
        "control T=1": {"temperature": 1.0, "sampling_seed": 3},
        "control T=1.5": {"temperature": 1.5, "sampling_seed": 3},
    }
    params = [{"max_new_tokens": N_TOKENS, **p} for p in cases.values()]
    outs = smollm_engine.generate(prompt=[PROMPT] * len(params), sampling_params=params)
    got = dict(zip(cases, (o["output_ids"] for o in outs), strict=True))
    for name in ("top_k=1 @ T=1", "top_k=1 @ T=1.5", "top_p=1e-6", "min_p=1"):
        assert got[name] == greedy_ids, name
    assert got["control T=1"] != greedy_ids
    assert got["control T=1.5"] != greedy_ids


def test_sampling_seed_reproduces_and_seeds_differ(smollm_engine: Any) -> None:
    first = smollm_engine.generate(
        prompt=[PROMPT, PROMPT],
        sampling_params=[{**HOT, "sampling_seed": 1}, {**HOT, "sampling_seed": 2}],
    )
    again = smollm_engine.generate(prompt=PROMPT, sampling_params={**HOT, "sampling_seed": 1})
    assert again["output_ids"] == first[0]["output_ids"]
    assert again["text"] == first[0]["text"]
    assert first[0]["output_ids"] != first[1]["output_ids"]
    assert len(first[0]["output_ids"]) == HOT["max_new_tokens"]


def test_n_returns_distinct_samples_in_prompt_order(smollm_engine: Any) -> None:
    params = {**HOT, "n": 2, "sampling_seed": 7}
    single = smollm_engine.generate(prompt="Once upon a time", sampling_params=params)
    assert isinstance(single, list) and len(single) == 2
    assert single[0]["text"] != single[1]["text"]
    assert single[0]["output_ids"] != single[1]["output_ids"]

    prompts = ["Once upon a time", "def fibonacci(n):"]
    outs = smollm_engine.generate(prompt=prompts, sampling_params=params)
    assert len(outs) == 4
    lens = [len(smollm_engine.tokenizer.encode(p)) for p in prompts]
    assert lens[0] != lens[1]  # so prompt_tokens tells the prompts apart
    assert [o["meta_info"]["prompt_tokens"] for o in outs] == [lens[0], lens[0], lens[1], lens[1]]
    # The first prompt's two samples are the ones the single call produced, in the same order.
    assert [o["output_ids"] for o in outs[:2]] == [o["output_ids"] for o in single]
    assert len({tuple(o["output_ids"]) for o in outs}) == 4
    assert len({o["meta_info"]["id"] for o in outs}) == 4


# ---- penalties --------------------------------------------------------------------------------

REPETITIVE = ["the the the the", "I like cats. I like cats. I like cats."]


@pytest.mark.parametrize(
    "penalty",
    [{"frequency_penalty": 2.0}, {"presence_penalty": 2.0}, {"repetition_penalty": 1.5}],
    ids=lambda p: next(iter(p)),
)
def test_penalties_reduce_repetition(smollm_engine: Any, penalty: dict[str, float]) -> None:
    params = [GREEDY] * len(REPETITIVE) + [{**GREEDY, **penalty}] * len(REPETITIVE)
    outs = smollm_engine.generate(prompt=REPETITIVE * 2, sampling_params=params)
    base, pen = outs[: len(REPETITIVE)], outs[len(REPETITIVE) :]
    for prompt, b, p in zip(REPETITIVE, base, pen, strict=True):
        assert repeats(b["output_ids"]) >= N_TOKENS // 2, f"control does not repeat: {prompt!r}"
        assert repeats(p["output_ids"]) < repeats(b["output_ids"]), (prompt, p["text"])


# ---- input forms ------------------------------------------------------------------------------


def test_input_ids_equal_prompt(smollm_engine: Any) -> None:
    prompts = [PROMPT, "Write a haiku about the sea:"]
    ids = [smollm_engine.tokenizer.encode(p) for p in prompts]
    params = {**GREEDY, "max_new_tokens": 12}
    by_text = smollm_engine.generate(prompt=prompts, sampling_params=params)
    by_ids = smollm_engine.generate(input_ids=ids, sampling_params=params)
    one = smollm_engine.generate(input_ids=ids[1], sampling_params=params)
    assert [o["output_ids"] for o in by_ids] == [o["output_ids"] for o in by_text]
    assert [o["text"] for o in by_ids] == [o["text"] for o in by_text]
    assert isinstance(one, dict) and one["output_ids"] == by_text[1]["output_ids"]
    assert [o["meta_info"]["prompt_tokens"] for o in by_ids] == [len(x) for x in ids]


# ---- validation -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("bad", "pattern"),
    [
        pytest.param({"temperature": -1.0}, r"^temperature", id="temperature"),
        pytest.param({"temperature": 0.0, "top_k": 0}, r"^top_k", id="top_k@T0"),
        pytest.param({"top_p": 0.0}, r"^top_p", id="top_p"),
        pytest.param({"top_k": 0}, r"^top_k", id="top_k"),
        pytest.param({"min_p": 1.5}, r"^min_p", id="min_p"),
        pytest.param({"max_new_tokens": 4, "min_new_tokens": 5}, r"^min_new_tokens", id="min_new"),
        pytest.param({"frequency_penalty": 3.0}, r"^frequency_penalty", id="frequency"),
        pytest.param({"stop_token_ids": [10**9]}, r"^stop_token_ids", id="stop_ids"),
        pytest.param({"temprature": 0.5}, r"temprature", id="unknown"),
        pytest.param({"temperature": "hot"}, r"^temperature: expected `float`", id="type"),
        pytest.param({"max_new_tokens": 4.0}, r"^max_new_tokens: expected `int`", id="int"),
    ],
)
def test_invalid_params_raise_and_engine_survives(
    smollm_engine: Any, greedy_ids: list[int], bad: dict[str, Any], pattern: str
) -> None:
    bad = {"max_new_tokens": 4, **bad}  # keeps an xfail (accepted request) cheap
    with pytest.raises(ValueError, match=pattern):
        smollm_engine.generate(prompt=PROMPT, sampling_params=bad)
    # Invalid in a batch: nothing of the batch may be left queued.
    with pytest.raises(ValueError, match=pattern):
        smollm_engine.generate(prompt=[PROMPT, PROMPT], sampling_params=[GREEDY, bad])
    assert not smollm_engine.scheduler.has_work()
    out = smollm_engine.generate(prompt=PROMPT, sampling_params={**GREEDY, "max_new_tokens": 4})
    assert out["output_ids"] == greedy_ids[:4]


# ---- over-long / empty prompts ----------------------------------------------------------------


def test_overlong_and_empty_prompts_abort_without_breaking_batch(
    smollm_engine: Any, greedy_ids: list[int]
) -> None:
    limit = smollm_engine.scheduler.max_req_input_len
    assert limit < smollm_engine.model_config.context_len
    valid = smollm_engine.tokenizer.encode(PROMPT)
    too_long = (valid * (limit // len(valid) + 2))[: limit + 1]
    outs = smollm_engine.generate(
        input_ids=[too_long, valid, []], sampling_params={**GREEDY, "max_new_tokens": 8}
    )
    long_out, ok, empty = outs
    reason = long_out["meta_info"]["finish_reason"]
    assert reason["type"] == "abort"
    assert str(limit + 1) in reason["message"] and str(limit) in reason["message"]
    assert long_out["output_ids"] == [] and long_out["text"] == ""
    assert long_out["meta_info"]["prompt_tokens"] == limit + 1
    assert empty["meta_info"]["finish_reason"]["type"] == "abort"
    assert "empty" in empty["meta_info"]["finish_reason"]["message"]
    assert ok["output_ids"] == greedy_ids[:8]
    assert ok["meta_info"]["finish_reason"] == {"type": "length", "length": 8}
    assert not smollm_engine.scheduler.has_work()
    smollm_engine.scheduler.check_memory_invariant()
