"""Prompt log-probabilities (SGLang's `logprob_start_len` / `input_token_logprobs`) on
SmolLM2-135M in float32, against transformers' own forward on the same weights: from the
first token and from the middle, with and without a cached prefix, in one prefill or in
chunks, and with top lists."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from radixserve.engine.entrypoints.http_errors import InvalidRequest

PROMPTS = [
    "The capital of France is Paris, and the capital of Italy is",
    "def add(a, b):\n    return a + b\n\nprint(add(2, 3))",
    "Once upon a time, in a small village at the edge of a dark forest, there lived an old "
    "woodcutter and his daughter. Every morning the two of them",
]
TOL = 2e-3  # float32 through other kernels: differences of 1e-4..1e-3 on logprobs near -10
GREEDY = {"temperature": 0, "max_new_tokens": 2}


def _reference(hf: Any, ids: list[int]) -> torch.Tensor:
    """transformers' log-probabilities [L, V] of the token after each prompt position."""
    with torch.no_grad():
        logits = hf(torch.tensor([ids])).logits[0].float()
    return torch.log_softmax(logits, dim=-1)


def _check(meta: dict[str, Any], ids: list[int], ref: torch.Tensor, start: int, top: int) -> None:
    rows = meta["input_token_logprobs"]
    assert [t for _, t, _ in rows] == ids[start:]
    for k, (lp, token, _) in enumerate(rows):
        pos = start + k
        if pos == 0:
            assert lp is None  # no context for the first token
            continue
        assert lp == pytest.approx(float(ref[pos - 1, token]), abs=TOL), f"position {pos}"
    if not top:
        assert "input_top_logprobs" not in meta
        return
    tops = meta["input_top_logprobs"]
    assert len(tops) == len(rows)
    for k, row in enumerate(tops):
        pos = start + k
        if pos == 0:
            assert row is None
            continue
        values, want = torch.topk(ref[pos - 1], top)
        assert [t for _, t, _ in row] == want.tolist(), f"top ids at position {pos}"
        assert [v for v, _, _ in row] == pytest.approx(values.tolist(), abs=TOL)


@pytest.fixture(scope="module")
def refs(smollm_engine: Any, hf_smollm: Any) -> list[tuple[list[int], torch.Tensor]]:
    encode = smollm_engine.tokenizer.encode
    return [(list(encode(p)), _reference(hf_smollm, list(encode(p)))) for p in PROMPTS]


@pytest.mark.parametrize("start", [0, 1, 7])
def test_prompt_logprobs_match_transformers(smollm_engine: Any, refs: Any, start: int) -> None:
    assert smollm_engine.scheduler.flush_cache()
    outs = smollm_engine.generate(
        input_ids=[ids for ids, _ in refs],
        sampling_params=GREEDY,
        return_logprob=True,
        top_logprobs_num=3,
        logprob_start_len=start,
    )
    for out, (ids, ref) in zip(outs, refs, strict=True):
        _check(out["meta_info"], ids, ref, start, 3)
        assert len(out["meta_info"]["output_token_logprobs"]) == 2  # outputs' as before


def test_a_cached_prompt_is_computed_again(smollm_engine: Any, refs: Any) -> None:
    """The radix cache holds the whole prompt after a first run; asking for its logprobs
    must not reuse the positions that compute them, and must not disturb the answer."""
    ids, ref = refs[2]
    assert smollm_engine.scheduler.flush_cache()
    plain = smollm_engine.generate(input_ids=ids, sampling_params=GREEDY)
    assert plain["meta_info"]["cached_tokens"] == 0
    again = smollm_engine.generate(
        input_ids=ids, sampling_params=GREEDY, return_logprob=True, logprob_start_len=20
    )
    assert 0 < again["meta_info"]["cached_tokens"] <= 19  # up to the first wanted position
    assert again["output_ids"] == plain["output_ids"]
    _check(again["meta_info"], ids, ref, 20, 0)
    cached = smollm_engine.generate(input_ids=ids, sampling_params=GREEDY, return_logprob=True)
    assert cached["meta_info"]["cached_tokens"] == len(ids) - 1  # without: the whole cache
    assert "input_token_logprobs" not in cached["meta_info"]


@pytest.mark.parametrize("overlap", [True, False], ids=["overlap", "no-overlap"])
def test_chunked_prefill_gives_the_same_logprobs(
    smollm_engine: Any, refs: Any, overlap: bool
) -> None:
    engine = smollm_engine.with_args(
        chunked_prefill_size=8, disable_overlap_schedule=not overlap, max_total_tokens=4096
    )
    try:
        outs = engine.generate(
            input_ids=[ids for ids, _ in refs],
            sampling_params=GREEDY,
            return_logprob=True,
            top_logprobs_num=2,
            logprob_start_len=0,
        )
        for out, (ids, ref) in zip(outs, refs, strict=True):
            assert len(ids) > 8  # two chunks or more
            _check(out["meta_info"], ids, ref, 0, 2)
    finally:
        engine.shutdown()


@pytest.mark.parametrize(
    ("start", "match"),
    [(-2, "logprob_start_len: expected an integer >= -1"), (99, "below the prompt's length")],
)
def test_bad_logprob_start_len_names_the_field(smollm_engine: Any, start: int, match: str) -> None:
    with pytest.raises(InvalidRequest, match=match):
        smollm_engine.generate(
            prompt="short", sampling_params=GREEDY, return_logprob=True, logprob_start_len=start
        )
