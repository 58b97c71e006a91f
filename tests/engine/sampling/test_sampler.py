"""Tests for SamplingBatchInfo's logits processors and the Sampler on synthetic logits."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import torch

from radixserve.engine.sampling import (
    Sampler,
    SamplingBatchInfo,
    SamplingParams,
    SamplingRow,
    make_generator,
)

V = 50
CPU = torch.device("cpu")
DRAWS = 2000


def _row(
    params: SamplingParams,
    *,
    prompt: Sequence[int] = (),
    output: Sequence[int] = (),
    stop: Sequence[int] = (),
    gen: torch.Generator | None = None,
) -> SamplingRow:
    return SamplingRow(params, list(prompt), list(output), frozenset(stop), gen)


def _info(rows: Sequence[SamplingRow]) -> SamplingBatchInfo:
    return SamplingBatchInfo.build(rows, V, CPU)


def _logits(batch: int = 1, seed: int = 0) -> torch.Tensor:
    return torch.randn(batch, V, generator=torch.Generator().manual_seed(seed))


def _from_probs(probs: Sequence[float]) -> torch.Tensor:
    """A [1, V] logits row whose first tokens have `probs`; the rest get ~0 probability."""
    logits = torch.full((1, V), -1e4)
    logits[0, : len(probs)] = torch.tensor(probs).log()
    return logits


def _draws(logits_row: torch.Tensor, params: SamplingParams, seed: int = 0) -> torch.Tensor:
    """DRAWS independent samples from one [1, V] logits row, all from one seeded generator."""
    gen = make_generator(seed, CPU)
    info = _info([_row(params, gen=gen) for _ in range(DRAWS)])
    return Sampler().sample(logits_row.expand(DRAWS, V).clone(), info).next_token_ids


def _processed(params: SamplingParams, **row_kwargs: Sequence[int]) -> torch.Tensor:
    """Zero logits [V] after the logits processors, for one row."""
    info = _info([_row(params, **row_kwargs)])
    return info.apply_logits_processors(torch.zeros(1, V))[0]


def _entropy(ids: torch.Tensor) -> float:
    p = torch.bincount(ids, minlength=V).float() / ids.numel()
    p = p[p > 0]
    return float(-(p * p.log()).sum())


# --- batch layout ---------------------------------------------------------------------------


def test_build_replaces_whole_vocab_top_k_with_vocab_size() -> None:
    info = _info([_row(SamplingParams(top_k=-1)), _row(SamplingParams(top_k=5))])
    assert info.top_ks.tolist() == [V, 5]


def test_build_skips_penalty_tensors_when_unused() -> None:
    info = _info([_row(SamplingParams(), prompt=[1], output=[2], stop=[0])])
    unused = (info.output_counts, info.seen_mask, info.min_tokens_mask, info.logit_bias)
    assert unused == (None, None, None, None)


# --- greedy -----------------------------------------------------------------------------------


@pytest.mark.parametrize("temperature", [0.05, 1.0, 5.0])
def test_top_k_1_equals_argmax_for_any_temperature(temperature: float) -> None:
    logits = _logits(batch=6)
    params = SamplingParams(temperature=temperature, top_k=1)
    info = _info([_row(params, gen=make_generator(i, CPU)) for i in range(6)])
    assert torch.equal(Sampler().sample(logits, info).next_token_ids, logits.argmax(-1))


def test_temperature_zero_equals_argmax_without_normalize() -> None:
    logits = _logits(batch=4)
    info = _info([_row(SamplingParams(temperature=0.0)) for _ in range(4)])
    assert torch.equal(Sampler().sample(logits, info).next_token_ids, logits.argmax(-1))


def test_greedy_row_in_sampled_batch_takes_argmax() -> None:
    logits = _logits().expand(200, V).clone()
    greedy, hot = SamplingParams(temperature=0.0), SamplingParams(temperature=5.0)
    gen = make_generator(0, CPU)
    info = _info([_row(greedy if i % 2 else hot, gen=gen) for i in range(200)])
    ids = Sampler().sample(logits, info).next_token_ids
    assert (ids[1::2] == logits[0].argmax()).all()
    assert (ids[0::2] != logits[0].argmax()).any()


# --- truncation filters -----------------------------------------------------------------------


def test_top_k_never_samples_outside_k_largest() -> None:
    logits = _logits()
    ids = _draws(logits, SamplingParams(top_k=5, temperature=3.0))
    assert set(ids.tolist()) == set(logits[0].topk(5).indices.tolist())


def test_small_top_p_samples_only_top_token() -> None:
    logits = _logits()
    ids = _draws(logits, SamplingParams(top_p=0.01, temperature=3.0))
    assert set(ids.tolist()) == {int(logits[0].argmax())}


def test_top_p_keeps_smallest_prefix_reaching_mass() -> None:
    # 0.5 < 0.7 so a second token is needed; 0.5 + 0.3 >= 0.7 so a third is not.
    ids = _draws(_from_probs([0.5, 0.3, 0.15, 0.05]), SamplingParams(top_p=0.7))
    assert set(ids.tolist()) == {0, 1}


def test_min_p_excludes_tokens_below_fraction_of_max() -> None:
    # Threshold 0.2 * 0.4 = 0.08 removes the 0.06 and 0.04 tokens.
    ids = _draws(_from_probs([0.4, 0.3, 0.2, 0.06, 0.04]), SamplingParams(min_p=0.2))
    assert set(ids.tolist()) == {0, 1, 2}


def test_unfiltered_sampling_reaches_low_prob_tokens() -> None:
    # Control for the filter tests above: without filters the tail does get drawn.
    ids = _draws(_from_probs([0.4, 0.3, 0.2, 0.06, 0.04]), SamplingParams())
    assert set(ids.tolist()) == {0, 1, 2, 3, 4}


# --- randomness -------------------------------------------------------------------------------


def _sequence(seed: int | None, steps: int = 30) -> list[int]:
    gen = make_generator(seed, CPU)
    info = _info([_row(SamplingParams(temperature=2.0), gen=gen)])
    logits = _logits()
    return [int(Sampler().sample(logits, info).next_token_ids[0]) for _ in range(steps)]


def test_fixed_seed_reproduces_draws() -> None:
    assert _sequence(1234) == _sequence(1234)


def test_different_seeds_give_different_draws() -> None:
    assert _sequence(1) != _sequence(2)


def test_unseeded_generators_differ() -> None:
    assert _sequence(None) != _sequence(None)


def test_higher_temperature_raises_entropy_of_draws() -> None:
    logits = _logits() * 3
    cold = _entropy(_draws(logits, SamplingParams(temperature=0.1)))
    hot = _entropy(_draws(logits, SamplingParams(temperature=3.0)))
    assert cold + 1.0 < hot


# --- logits processors ------------------------------------------------------------------------


def test_frequency_penalty_scales_with_count() -> None:
    out = _processed(SamplingParams(frequency_penalty=0.5), output=[7, 7, 7, 3])
    assert (out[7].item(), out[3].item(), out[9].item()) == (-1.5, -0.5, 0.0)


def test_presence_penalty_applies_once_regardless_of_count() -> None:
    out = _processed(SamplingParams(presence_penalty=0.5), output=[7, 7, 7, 3])
    assert (out[7].item(), out[3].item(), out[9].item()) == (-0.5, -0.5, 0.0)


def test_penalties_ignore_prompt_tokens() -> None:
    params = SamplingParams(frequency_penalty=1.0, presence_penalty=1.0)
    assert _processed(params, prompt=[4, 4]).abs().sum().item() == 0.0


def test_repetition_penalty_lowers_seen_logits_of_both_signs() -> None:
    logits = torch.zeros(1, V)
    logits[0, 1], logits[0, 2], logits[0, 3] = 2.0, -2.0, 2.0
    params = SamplingParams(repetition_penalty=2.0)
    info = _info([_row(params, prompt=[1], output=[2])])
    out = info.apply_logits_processors(logits)[0]
    assert (out[1].item(), out[2].item(), out[3].item()) == (1.0, -4.0, 2.0)


def test_min_new_tokens_blocks_eos_while_output_is_short() -> None:
    logits = _logits()
    logits[0, 0] = 50.0  # EOS would otherwise always win
    params = SamplingParams(min_new_tokens=3)
    gen = make_generator(0, CPU)
    info = _info([_row(params, output=[5, 6], stop=[0], gen=gen) for _ in range(DRAWS)])
    ids = Sampler().sample(logits.expand(DRAWS, V).clone(), info).next_token_ids
    assert (ids != 0).all()


def test_min_new_tokens_allows_eos_once_reached() -> None:
    logits = _logits()
    logits[0, 0] = 50.0
    params = SamplingParams(min_new_tokens=3, temperature=0.0)
    info = _info([_row(params, output=[5, 6, 7], stop=[0])])
    assert Sampler().sample(logits, info).next_token_ids.tolist() == [0]


def test_logit_bias_forces_token() -> None:
    ids = _draws(_logits(), SamplingParams(logit_bias={13: 100.0}, temperature=2.0))
    assert set(ids.tolist()) == {13}


# --- outputs ----------------------------------------------------------------------------------


def test_logprobs_are_raw_log_softmax_at_chosen_ids() -> None:
    logits = _logits(batch=4)
    params = SamplingParams(temperature=0.3, top_k=3, repetition_penalty=1.5, logit_bias={0: 2})
    gens = [make_generator(i, CPU) for i in range(4)]
    info = _info([_row(params, prompt=[1, 2], gen=g) for g in gens])
    out = Sampler().sample(logits, info)
    expected = torch.log_softmax(logits, -1).gather(1, out.next_token_ids[:, None])[:, 0]
    assert torch.allclose(out.logprobs, expected)


def test_top_logprobs_are_sorted_and_match_topk() -> None:
    logits = _logits(batch=3)
    info = _info([_row(SamplingParams(temperature=0.0)) for _ in range(3)])
    out = Sampler().sample(logits, info, top_logprobs_nums=[3, 0, 5])
    assert out.top_logprobs is not None
    assert out.top_logprobs[1] == []
    for i, n in ((0, 3), (2, 5)):
        values, ids = torch.log_softmax(logits[i], -1).topk(n)
        got_values = torch.tensor([v for v, _ in out.top_logprobs[i]])
        assert got_values.tolist() == sorted(got_values.tolist(), reverse=True)
        assert [t for _, t in out.top_logprobs[i]] == ids.tolist()
        assert torch.allclose(got_values, values)


def test_top_logprobs_absent_when_not_asked() -> None:
    info = _info([_row(SamplingParams())])
    assert Sampler().sample(_logits(), info, top_logprobs_nums=[0]).top_logprobs is None


def test_sample_leaves_input_logits_unchanged() -> None:
    logits = _logits(batch=2)
    before = logits.clone()
    params = SamplingParams(logit_bias={1: 5.0}, frequency_penalty=1.0)
    info = _info([_row(params, output=[3]) for _ in range(2)])
    Sampler().sample(logits, info)
    assert torch.equal(logits, before)


def test_next_token_ids_are_int64() -> None:
    info = _info([_row(SamplingParams(), gen=make_generator(0, CPU))])
    assert Sampler().sample(_logits(), info).next_token_ids.dtype == torch.int64


def test_all_greedy_fast_path_matches_argmax_and_log_softmax() -> None:
    """All-greedy rows with nothing to apply skip the processors and the full log_softmax;
    ids and log-probs must be what torch's argmax and log_softmax give (bf16 logits too)."""
    greedy = SamplingParams(temperature=0.0)
    for dtype in (torch.float32, torch.bfloat16):
        logits = _logits(batch=6, seed=3).to(dtype)
        info = _info([_row(greedy) for _ in range(6)])
        assert info.is_all_greedy and not info.has_logits_processors
        out = Sampler().sample(logits, info)
        want_ids = logits.float().argmax(dim=-1)
        want_lp = torch.log_softmax(logits.float(), dim=-1).gather(1, want_ids.unsqueeze(1))
        assert torch.equal(out.next_token_ids, want_ids)
        torch.testing.assert_close(out.logprobs, want_lp.squeeze(1))
        assert out.top_logprobs is None
        assert logits.dtype == dtype  # the caller's logits are left as they were


def test_greedy_rows_with_a_penalty_take_the_processed_argmax() -> None:
    """A repetition penalty turns the fast path off: the penalised token loses the argmax."""
    logits = _from_probs([0.6, 0.4])
    penalised = SamplingParams(temperature=0.0, repetition_penalty=10.0)
    info = _info([_row(penalised, output=[0])])
    assert info.has_logits_processors
    assert Sampler().sample(logits, info).next_token_ids.tolist() == [1]
