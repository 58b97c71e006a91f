"""Speculation keeps the target distribution at temperature > 0 (top-k and top-p included).

A tiny random Llama (vocabulary 256, float32) samples the first three tokens of one prompt
thousands of times, with and without NGRAM speculation (the first comes from the prefill; the
second and third from one verify when the draft is accepted, else from two). The exact
distribution of the three comes from transformers on the same weights (the oracle):
p(a) · p(b | a) · p(c | a, b), each filtered as the request asks. Chi-square goodness-of-fit
tests, of the three tokens and of the first two (where a fault of the rule shows most), must
not reject either run at the 0.1 % level; a broken acceptance rule (off by one: each draft judged by
the distribution that follows it instead of the one it was drawn for) run once on purpose
must be rejected at that level.

Every request shares the prompt, so drafts come from earlier requests' samples after the same
first token (drawn from p: often accepted, often not): both branches of the rule are
exercised, and the test checks that they were.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from tests.engine.models.tiny import hf_last_logits, random_prompts, save_tiny

SAMPLES = 4000
TOKENS = 3
PARAMS = {
    "temperature": 1.0,
    "top_k": 3,
    "top_p": 0.95,
    "max_new_tokens": TOKENS,
    "ignore_eos": True,
}
LEVEL = 1e-3  # the test rejects a correct sampler once in a thousand runs
# Waves of 64: a later wave drafts from what earlier ones sampled after the same first token.
SPEC = {
    "speculative_algorithm": "NGRAM",
    "speculative_num_draft_tokens": 3,
    "max_running_requests": 64,
}


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return tmp_path_factory.mktemp("spec-llama")


@pytest.fixture(scope="module")
def tiny(folder: Any) -> Iterator[tuple[Any, Any]]:
    from radixserve.engine import EngineCore

    hf = save_tiny("llama", folder, seed=5)
    engine = EngineCore(
        model_path=str(folder), max_total_tokens=16384, dtype="float32", random_seed=7
    )
    yield hf, engine
    engine.shutdown()


def prompt() -> list[int]:
    return random_prompts((12,), seed=21)[0]


def filtered(logits: torch.Tensor) -> torch.Tensor:
    """The sampler's distribution: temperature, then top-k, then top-p over what top-k kept
    (a token stays while the mass before it is under top_p; the first always stays)."""
    probs = torch.softmax(logits.double() / PARAMS["temperature"], dim=-1)
    top, ids = probs.topk(PARAMS["top_k"])
    before = top.cumsum(0) - top
    keep = before < PARAMS["top_p"] * top.sum()
    out = torch.zeros_like(probs)
    out[ids[keep]] = top[keep]
    return out / out.sum()


Seq = tuple[int, ...]


def exact_joint(hf: Any, ids: list[int], depth: int = TOKENS) -> dict[Seq, float]:
    """The probability of every continuation of `depth` tokens the filters allow."""
    if depth == 0:
        return {(): 1.0}
    first = filtered(hf_last_logits(hf, ids))
    joint = {}
    for a in first.nonzero().flatten().tolist():
        for rest, p in exact_joint(hf, [*ids, a], depth - 1).items():
            joint[(a, *rest)] = float(first[a]) * p
    return joint


def chi_square_p(counts: Counter[Seq], joint: dict[Seq, float]) -> float:
    """Goodness of fit; outputs expected fewer than 5 times are pooled into one cell. An output
    the distribution cannot produce (outside what top-k / top-p keep) rejects it outright."""
    n = sum(counts.values())
    cells, pooled_obs, pooled_exp = [], 0.0, 0.0
    for seq, p in joint.items():
        if n * p >= 5:
            cells.append((counts[seq], n * p))
        else:
            pooled_obs, pooled_exp = pooled_obs + counts[seq], pooled_exp + n * p
    if sum(counts[seq] for seq in joint) != n:
        return 0.0
    if pooled_exp > 0:
        cells.append((pooled_obs, pooled_exp))
    stat = sum((o - e) ** 2 / e for o, e in cells)
    df = torch.tensor((len(cells) - 1) / 2, dtype=torch.float64)
    return float(torch.special.gammaincc(df, torch.tensor(stat / 2, dtype=torch.float64)))


def marginal(counts: dict[Seq, Any], k: int) -> Any:
    """The first k tokens' counts (or probabilities)."""
    out: dict[Seq, Any] = {}
    for seq, v in counts.items():
        out[seq[:k]] = out.get(seq[:k], 0) + v
    return Counter(out) if isinstance(counts, Counter) else out


def fits(counts: Counter[Seq], joint: dict[Seq, float]) -> tuple[float, float]:
    """p-values of the three tokens and of the first two."""
    return chi_square_p(counts, joint), chi_square_p(marginal(counts, 2), marginal(joint, 2))


def sample(engine: Any, spec: dict[str, Any] | None) -> tuple[Counter[Seq], Any]:
    run = engine.with_args(**(spec or {"max_running_requests": 64}))
    try:
        outs = run.generate(input_ids=[prompt()] * SAMPLES, sampling_params=PARAMS)
        run.scheduler.check_memory_invariant()
        stats = run.scheduler.spec.stats if spec is not None else None
    finally:
        run.shutdown()
    return Counter(tuple(o["output_ids"]) for o in outs), stats


def test_speculation_keeps_the_distribution(tiny: tuple[Any, Any]) -> None:
    hf, engine = tiny
    joint = exact_joint(hf, prompt())
    plain, _ = sample(engine, None)
    assert min(fits(plain, joint)) > LEVEL
    speculated, stats = sample(engine, SPEC)
    assert min(fits(speculated, joint)) > LEVEL
    # both branches ran: drafts accepted (two tokens from one verify) and rejected
    assert stats.accept_length_counts[2] > SAMPLES // 10
    assert stats.accept_length_counts[1] > SAMPLES // 10


def test_a_broken_acceptance_rule_is_rejected(
    tiny: tuple[Any, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    from radixserve.engine.speculative import verify

    def broken(probs: torch.Tensor, draft: Any, start: int, generator: Any) -> list[int]:
        out: list[int] = []
        for j, token in enumerate(draft):
            row = probs[start + j + 1]  # off by one: the row after the draft, not before it
            u = float(torch.rand(1, generator=generator))
            if u * float(row.sum()) < float(row[token]):
                out.append(token)
                continue
            residual = row.clone()
            residual[token] = 0.0
            return [*out, verify._draw(residual, generator, token)]
        return [*out, verify._draw(probs[start + len(draft)], generator, 0)]

    monkeypatch.setattr(verify, "_accept_sampled", broken)
    hf, engine = tiny
    speculated, _ = sample(engine, SPEC)
    assert fits(speculated, exact_joint(hf, prompt()))[1] < LEVEL


def test_a_draft_model_keeps_the_distribution(tiny: tuple[Any, Any], folder: Any) -> None:
    """STANDALONE, the target as its own draft: each draft is the argmax (a point mass), so it
    is accepted with probability p(argmax) and the rest comes from the residual."""
    hf, engine = tiny
    flags = {
        "speculative_algorithm": "STANDALONE",
        "speculative_draft_model_path": str(folder),
        "speculative_num_steps": 1,
    }
    speculated, stats = sample(engine, flags)
    assert min(fits(speculated, exact_joint(hf, prompt()))) > LEVEL
    assert stats.accept_length_counts[2] > SAMPLES // 10
    assert stats.accept_length_counts[1] > SAMPLES // 10
