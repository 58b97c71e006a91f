"""Verification of draft tokens against the target model's logits at every position.

A verify forward computes, for request i with drafts d_1..d_k, the logits that follow its last
token and each draft (k + 1 rows). Its sampling rows are laid out the same way: row j of
request i is the request as if d_1..d_j had been accepted, so penalties, min-new-tokens and
logit bias see exactly the outputs they would have seen decoding one token at a time.

- Greedy: the target at position j is the argmax of row j; drafts are accepted while they equal
  it, and the target after the last accepted draft is the bonus token.
- Sampled (temperature > 0, with top-k / top-p / min-p): a draft is a point mass q = δ(d), so
  the rejection rule accepts d with probability min(1, p(d) / q(d)) = p(d), and at the first
  rejection draws from the residual max(p − q, 0) normalised, which is p without d. Every
  emitted token is then distributed exactly as p of its position (Leviathan et al. 2023,
  Chen et al. 2023); if all drafts are accepted the bonus is drawn from the last row's p.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

import torch

from radixserve.engine.sampling import (
    SamplingBatchInfo,
    draw_from_cdf,
    filtered_probs,
    top_logprobs_of,
)

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class VerifyOutput:
    """What one verify step emitted per request: the accepted drafts and then the target's
    own token (so at least one token each), with their raw log-probabilities."""

    tokens: list[list[int]]
    logprobs: list[list[float]]
    top_logprobs: list[list[list[tuple[float, int]]]] | None  # per request, per token
    next_token_ids: torch.Tensor  # [B] int64: each request's last token (its next input)

    @property
    def num_accepted_drafts(self) -> list[int]:
        return [len(t) - 1 for t in self.tokens]


def verify_drafts(
    logits: torch.Tensor,
    info: SamplingBatchInfo,
    drafts: Sequence[Sequence[int]],
    top_logprobs_nums: list[int] | None = None,
) -> VerifyOutput:
    """`logits` [T, V] with T = Σ (len(drafts[i]) + 1), rows in request order; `info` and
    `top_logprobs_nums` laid out over the same T rows."""
    processed = logits.float()
    if info.has_logits_processors:
        processed = info.apply_logits_processors(processed.clone())
    targets = processed.argmax(dim=-1).tolist()
    probs = _dense_probs(processed, info)
    tokens: list[list[int]] = []
    positions: list[int] = []  # the logits row each emitted token was chosen at
    start = 0
    for draft in drafts:
        rows = range(start, start + len(draft) + 1)
        if info.greedy_rows[start]:
            out = _accept_greedy(targets, draft, start)
        else:
            assert probs is not None
            out = _accept_sampled(probs, draft, start, info.generators[start])
        tokens.append(out)
        positions += rows[: len(out)]
        start = rows.stop
    # raw log-probabilities (as the sampler reports them) of the emitted rows only
    emitted = torch.tensor(positions, dtype=torch.int64, device=logits.device)
    raw_logprobs = torch.log_softmax(logits.index_select(0, emitted).float(), dim=-1)
    chosen_ids = torch.tensor([t for ts in tokens for t in ts], device=logits.device)
    chosen = raw_logprobs.gather(1, chosen_ids.unsqueeze(1)).squeeze(1).tolist()
    nums = None if top_logprobs_nums is None else [top_logprobs_nums[p] for p in positions]
    return VerifyOutput(
        tokens=tokens,
        logprobs=_split(chosen, tokens),
        top_logprobs=_top_per_token(raw_logprobs, nums, tokens),
        next_token_ids=torch.tensor([ts[-1] for ts in tokens], dtype=torch.int64),
    )


def _accept_greedy(targets: list[int], draft: Sequence[int], start: int) -> list[int]:
    out: list[int] = []
    for j, token in enumerate(draft):
        if token != targets[start + j]:
            break
        out.append(token)
    out.append(targets[start + len(out)])
    return out


def _accept_sampled(
    probs: torch.Tensor, draft: Sequence[int], start: int, generator: torch.Generator | None
) -> list[int]:
    """Accept each draft with probability p(d); at the first rejection draw from p without d;
    after the last draft, draw the bonus from p. `probs` [T, V] unnormalised, filtered."""
    out: list[int] = []
    for j, token in enumerate(draft):
        row = probs[start + j]
        total = float(row.sum())
        u = float(torch.rand(1, generator=generator, device=row.device, dtype=row.dtype))
        if total > 0 and u * total < float(row[token]):
            out.append(token)
            continue
        residual = row.clone()
        residual[token] = 0.0
        out.append(_draw(residual, generator, fallback=token))
        return out
    out.append(_draw(probs[start + len(draft)], generator, fallback=0))
    return out


def _draw(row: torch.Tensor, generator: torch.Generator | None, fallback: int) -> int:
    at = draw_from_cdf(row.cumsum(dim=-1), generator)
    return fallback if at is None else at


def _dense_probs(processed: torch.Tensor, info: SamplingBatchInfo) -> torch.Tensor | None:
    """Each sampled row's filtered probabilities [T, V] (unnormalised), in vocabulary order;
    None when every row is greedy."""
    if info.is_all_greedy:
        return None
    probs, ids = filtered_probs(processed, info)
    if ids is None:
        return probs
    return torch.zeros_like(processed).scatter_(1, ids, probs)


def _split(values: list[T], tokens: list[list[int]]) -> list[list[T]]:
    """`values`, one per emitted token, cut into each request's."""
    out, start = [], 0
    for ts in tokens:
        out.append(values[start : start + len(ts)])
        start += len(ts)
    return out


def _top_per_token(
    raw_logprobs: torch.Tensor, nums: list[int] | None, tokens: list[list[int]]
) -> list[list[list[tuple[float, int]]]] | None:
    """`raw_logprobs` and `nums`: one row per emitted token."""
    if not nums or max(nums) <= 0:
        return None
    rows = top_logprobs_of(raw_logprobs, nums)
    assert rows is not None
    return _split(rows, tokens)
