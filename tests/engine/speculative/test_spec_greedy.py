"""Greedy outputs are the same with and without speculation: NGRAM, and STANDALONE with a tiny
random draft model (whose drafts are nearly all rejected) or the target itself as its own
draft (whose drafts are all accepted).

The reference is the plain engine (no speculation); the speculating engine must give the same
ids, the same log-probabilities (within float noise: a verify computes a token's logits in
another forward than a decode), leave no KV behind, and really have speculated (drafts
accepted, so the multi-token path is what produced the outputs).

- SmolLM2 (float32): 16 prompts, half of them prompts that repeat spans (code to rewrite,
  quotes), with logprobs and top logprobs.
- The tiny Llama of the scheduling matrix: a covering subset of its 48 cases (radix cache on
  and off, chunked prefill, mixed chunks, each policy, pages of 1 and 16) and a pool small
  enough to force retractions, for each algorithm.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.conftest import PROMPTS
from tests.engine.scheduler.test_scheduling_correctness import (
    GREEDY,
    RETRACT,
    SMOLLM_SUBSET,
    _id,
    plain_outputs,
    tiny_prompts,
)

SPEC = {"speculative_algorithm": "NGRAM", "speculative_num_draft_tokens": 5}

CODE = """def area(width, height):
    return width * height


def perimeter(width, height):
    return 2 * (width + height)
"""
REPEATING = [
    f"Rewrite this code with type hints:\n\n{CODE}\nWith type hints:\n\n",
    f"Copy this code exactly:\n\n{CODE}\nThe copy:\n\n",
    "Repeat after me: the cat sat on the mat. The cat sat on the mat. The cat sat",
    'The speaker said "we will build it here, and we will build it now". Quote the speaker: "',
    "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18,",
    "Monday, Tuesday, Wednesday. Monday, Tuesday, Wednesday. Monday,",
    "<li>apple</li>\n<li>banana</li>\n<li>cherry</li>\n<li>",
    "To be or not to be, that is the question. To be or not to be,",
]


def test_smollm_16_prompts_identical_with_logprobs(smollm_engine: Any) -> None:
    prompts = PROMPTS + REPEATING
    assert len(prompts) == 16
    params = {"temperature": 0, "max_new_tokens": 40}
    kw = {"return_logprob": True, "top_logprobs_num": 2}
    expected = smollm_engine.generate(prompt=prompts, sampling_params=params, **kw)
    spec = smollm_engine.with_args(**SPEC)
    try:
        outs = spec.generate(prompt=prompts, sampling_params=params, **kw)
        spec.scheduler.check_memory_invariant()
        stats = spec.scheduler.spec.stats
    finally:
        spec.shutdown()
    assert [o["output_ids"] for o in outs] == [o["output_ids"] for o in expected]
    assert [o["meta_info"]["finish_reason"] for o in outs] == [
        o["meta_info"]["finish_reason"] for o in expected
    ]
    for got, want in zip(outs, expected, strict=True):
        lp, lp_want = got["meta_info"]["output_token_logprobs"], want["meta_info"]
        assert [x[0] for x in lp] == pytest.approx(
            [x[0] for x in lp_want["output_token_logprobs"]], abs=1e-3
        )
        tops = got["meta_info"]["output_top_logprobs"]
        assert [[t[1] for t in step] for step in tops] == [
            [t[1] for t in step] for step in lp_want["output_top_logprobs"]
        ]
    assert stats.accepted_drafts > 100  # the repeating prompts' answers were mostly drafted
    assert sum(n * c for n, c in enumerate(stats.accept_length_counts)) > stats.verified_reqs


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from tests.engine.models.tiny import save_tiny

    folder = tmp_path_factory.mktemp("spec-sched-llama")
    save_tiny("llama", folder / "target", seed=3)
    save_tiny("llama", folder / "draft", seed=4, num_hidden_layers=1)
    return folder


@pytest.fixture(scope="module")
def tiny_engine(tiny_folder: Any) -> Any:
    from radixserve.engine import EngineCore

    engine = EngineCore(
        model_path=str(tiny_folder / "target"), max_total_tokens=16384, dtype="float32"
    )
    yield engine
    engine.shutdown()


ALGORITHMS = ["ngram", "standalone-random", "standalone-self"]


def spec_flags(algorithm: str, folder: Any) -> dict[str, Any]:
    if algorithm == "ngram":
        return SPEC
    draft = folder / ("draft" if algorithm == "standalone-random" else "target")
    return {
        "speculative_algorithm": "STANDALONE",
        "speculative_draft_model_path": str(draft),
        "speculative_num_steps": 3,
    }


def repeating_tiny_prompts() -> list[list[int]]:
    """The matrix's prompts, each with its first 24 tokens repeated at its end, so drafts are
    found (and, the model being random, often rejected)."""
    return [p + p[:24] for p in tiny_prompts()]


@pytest.fixture(scope="module")
def tiny_reference(tiny_engine: Any) -> list[list[int]]:
    return plain_outputs(tiny_engine, repeating_tiny_prompts(), {**GREEDY, "max_new_tokens": 16})


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("case", SMOLLM_SUBSET, ids=[_id(c) for c in SMOLLM_SUBSET])
def test_tiny_matrix_subset_identical(
    tiny_engine: Any,
    tiny_folder: Any,
    tiny_reference: list[list[int]],
    case: tuple[Any, ...],
    algorithm: str,
) -> None:
    no_radix, chunk, mixed, policy, page = case
    spec = tiny_engine.with_args(
        **spec_flags(algorithm, tiny_folder),
        disable_radix_cache=no_radix,
        chunked_prefill_size=chunk,
        enable_mixed_chunk=mixed,
        schedule_policy=policy,
        page_size=page,
        max_total_tokens=6144,
    )
    try:
        params = {**GREEDY, "max_new_tokens": 16}
        outs = spec.generate(input_ids=repeating_tiny_prompts(), sampling_params=params)
        spec.scheduler.check_memory_invariant()
        stats = spec.scheduler.spec.stats
    finally:
        spec.shutdown()
    assert [o["output_ids"] for o in outs] == tiny_reference
    assert stats.verified_reqs > 0
    if algorithm == "standalone-self":  # its own drafts: every one accepted
        assert stats.accepted_drafts == stats.proposed_drafts > 0


@pytest.mark.parametrize("algorithm", ["ngram", "standalone-self"])
@pytest.mark.parametrize("page_size", [1, 16])
def test_tiny_retractions_keep_outputs(
    tiny_engine: Any, tiny_folder: Any, page_size: int, algorithm: str
) -> None:
    prompts = repeating_tiny_prompts()
    expected = plain_outputs(tiny_engine, prompts, RETRACT)
    tight = tiny_engine.with_args(
        **spec_flags(algorithm, tiny_folder),
        max_total_tokens=1200,
        page_size=page_size,
        chunked_prefill_size=64,
    )
    try:
        outs = tight.generate(input_ids=prompts, sampling_params=RETRACT)
        assert sum(o["meta_info"]["total_retractions"] for o in outs) > 0
        assert tight.scheduler.spec.stats.accepted_drafts > 0
        tight.scheduler.check_memory_invariant()
    finally:
        tight.shutdown()
    assert [o["output_ids"] for o in outs] == expected


def test_penalties_and_min_tokens_see_each_draft_position(smollm_engine: Any) -> None:
    """Each position of a verify is sampled as the request with the drafts before it accepted:
    repetition, frequency and presence penalties, min_new_tokens and logit_bias give the plain
    engine's greedy tokens (a penalty applied once per verify would let repeats through)."""
    eos = smollm_engine.tokenizer.eos_token_id
    params = {
        "temperature": 0,
        "max_new_tokens": 32,
        "repetition_penalty": 1.15,
        "frequency_penalty": 0.3,
        "presence_penalty": 0.2,
        "min_new_tokens": 12,
        "logit_bias": {str(eos): 2.0},
    }
    expected = smollm_engine.generate(prompt=REPEATING, sampling_params=params)
    spec = smollm_engine.with_args(**SPEC)
    try:
        outs = spec.generate(prompt=REPEATING, sampling_params=params)
        spec.scheduler.check_memory_invariant()
        accepted = spec.scheduler.spec.stats.accepted_drafts
    finally:
        spec.shutdown()
    assert [o["output_ids"] for o in outs] == [o["output_ids"] for o in expected]
    assert accepted > 0


def test_smollm_16_prompts_identical_with_a_tiny_draft(
    smollm_engine: Any, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """STANDALONE on the real model: a tiny random Llama with SmolLM2's vocabulary drafts (its
    drafts are almost all rejected, so nearly every token is the verify's correction: the
    path a poor draft takes)."""
    from tests.engine.models.tiny import save_tiny

    vocab = smollm_engine.core.model_config.vocab_size
    draft = tmp_path_factory.mktemp("smollm-draft")
    save_tiny(
        "llama", draft, seed=6, num_hidden_layers=1, vocab_size=vocab,
        max_position_embeddings=8192,
    )  # fmt: skip
    prompts = PROMPTS + REPEATING
    params = {"temperature": 0, "max_new_tokens": 16}
    expected = smollm_engine.generate(prompt=prompts, sampling_params=params)
    spec = smollm_engine.with_args(
        speculative_algorithm="STANDALONE",
        speculative_draft_model_path=str(draft),
        speculative_num_steps=2,
    )
    try:
        outs = spec.generate(prompt=prompts, sampling_params=params)
        spec.scheduler.check_memory_invariant()
        stats = spec.scheduler.spec.stats
    finally:
        spec.shutdown()
    assert [o["output_ids"] for o in outs] == [o["output_ids"] for o in expected]
    # a random draft's are rejected: after two verifies each request backs off (a pause of
    # 4 steps, then 8), so about three verifies per request in 16 tokens
    assert stats.verified_reqs >= len(prompts) * 2
