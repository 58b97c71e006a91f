"""The sampler's candidate path (filters among each row's most likely ids) against its oracle,
the full sort of the vocabulary, and the one-number inverse-CDF draw against the distribution."""

from __future__ import annotations

import pytest
import torch

from radixserve.engine.sampling import (
    Sampler,
    SamplingBatchInfo,
    SamplingParams,
    SamplingRow,
    make_generator,
)
from radixserve.engine.sampling import sampler as sampler_module

V = 4096
CPU = torch.device("cpu")


def _info(params: list[SamplingParams]) -> SamplingBatchInfo:
    rows = [
        SamplingRow(p, [], [], frozenset(), make_generator(i, CPU)) for i, p in enumerate(params)
    ]
    return SamplingBatchInfo.build(rows, V, CPU)


def _peaked_logits(batch: int, seed: int = 0) -> torch.Tensor:
    """Logits whose mass sits in a few hundred ids, as a language model's do."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, V, generator=g) * 4


def _in_vocab_order(probs: torch.Tensor, ids: torch.Tensor | None) -> torch.Tensor:
    if ids is None:
        return probs
    return torch.zeros(probs.shape[0], V).scatter_(1, ids, probs)


PARAMS = [
    SamplingParams(temperature=0.7, top_p=0.9),
    SamplingParams(temperature=1.0, top_k=40),
    SamplingParams(temperature=1.3, top_k=200, top_p=0.8),
    SamplingParams(temperature=0.9, min_p=0.05),
    SamplingParams(temperature=1.0, top_p=0.95, min_p=0.02),
    SamplingParams(temperature=0.0),  # a greedy row in the sampled batch
]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_candidates_keep_what_the_full_sort_keeps(
    monkeypatch: pytest.MonkeyPatch, seed: int
) -> None:
    monkeypatch.setattr(sampler_module, "CANDIDATES", 512)
    logits = _peaked_logits(len(PARAMS), seed)
    info = _info(PARAMS)
    probs = torch.softmax(logits / info.temperatures, dim=-1)
    found = sampler_module._filtered_candidates(probs, info)
    assert found is not None, "the peaked rows must be decided among the candidates"
    got = _in_vocab_order(*found)
    want = sampler_module._filtered_probs(probs, info)
    sampled = [not g for g in info.greedy_rows]
    assert torch.equal(got[sampled] > 0, want[sampled] > 0)
    torch.testing.assert_close(got[sampled], want[sampled])


def test_a_kept_set_past_the_candidates_falls_back_to_the_full_sort(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(sampler_module, "CANDIDATES", 64)
    flat = torch.zeros(1, V)  # every id equally likely: top_p 0.5 keeps 2,048 of them
    info = _info([SamplingParams(temperature=1.0, top_p=0.5)])
    probs = torch.softmax(flat, dim=-1)
    assert sampler_module._filtered_candidates(probs, info) is None
    ids = Sampler().sample(flat, info).next_token_ids
    assert 0 <= int(ids[0]) < V


def test_draws_follow_the_filtered_distribution(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sampler_module, "CANDIDATES", 64)
    logits = torch.full((1, V), -30.0)
    logits[0, :4] = torch.tensor([0.5, 0.3, 0.15, 0.05]).log()
    draws = 4000
    gen = make_generator(7, CPU)
    rows = [SamplingRow(SamplingParams(top_p=0.9), [], [], frozenset(), gen)] * draws
    info = SamplingBatchInfo.build(rows, V, CPU)
    ids = Sampler().sample(logits.expand(draws, V).clone(), info).next_token_ids
    counts = torch.bincount(ids, minlength=V).float() / draws
    # top_p 0.9 keeps the first three (0.5 + 0.3 < 0.9 <= 0.95): 0.5/0.95, 0.3/0.95, 0.15/0.95.
    expected = torch.tensor([0.5, 0.3, 0.15]) / 0.95
    assert set(ids.tolist()) == {0, 1, 2}
    torch.testing.assert_close(counts[:3], expected, atol=0.03, rtol=0)


def test_a_seeded_row_draws_the_same_id_whichever_path_its_batch_takes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The oracle is the row's own draw alone (candidates path): beside a flat row that sends the
    whole batch down the full sort, the same seed must give the same ids (the n samples of one
    request, and a re-run with other neighbours, are reproducible)."""
    monkeypatch.setattr(sampler_module, "CANDIDATES", 64)
    peaked = _peaked_logits(1, seed=3)
    flat = torch.zeros(1, V)
    params = SamplingParams(temperature=1.0, top_p=0.9)
    wide = SamplingParams(temperature=1.0, top_p=0.5)
    alone, beside = [], []
    for step in range(40):
        gen_a, gen_b = make_generator(step, CPU), make_generator(step, CPU)
        info_a = SamplingBatchInfo.build([SamplingRow(params, [], [], frozenset(), gen_a)], V, CPU)
        assert sampler_module._filtered_candidates(torch.softmax(peaked, -1), info_a) is not None
        alone.append(int(Sampler().sample(peaked.clone(), info_a).next_token_ids[0]))
        rows = [
            SamplingRow(params, [], [], frozenset(), gen_b),
            SamplingRow(wide, [], [], frozenset(), make_generator(99, CPU)),
        ]
        info_b = SamplingBatchInfo.build(rows, V, CPU)
        both = torch.cat([peaked, flat]).clone()
        beside.append(int(Sampler().sample(both, info_b).next_token_ids[0]))
    assert alone == beside
    assert len(set(alone)) > 1  # the draws really vary with the seed
