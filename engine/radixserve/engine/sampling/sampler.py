"""Token selection: from a batch's logits and its `SamplingBatchInfo` to the next token ids.

Owns the sampling pipeline (logits processors, temperature, top-k / top-p / min-p filtering,
per-row seeded draws), the log-probabilities reported back to clients, and `make_generator`,
the one place that seeds per-request random generators.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass

import torch

from radixserve.kernels.cpu.fused_ops import load_fused_ops

from .sampling_batch_info import SamplingBatchInfo


@dataclass(frozen=True, slots=True)
class PromptLogprobs:
    """One request's prompt log-probabilities computed by one forward (a chunk's share)."""

    token_logprobs: list[float]  # of each prompt token after a computed row, in order
    top_logprobs: list[list[tuple[float, int]]]  # per row, best (logprob, id) first; or []


@dataclass(frozen=True, slots=True)
class SampleOutput:
    """The chosen tokens of one step and their log-probabilities.

    Log-probabilities are taken from the RAW model distribution, log_softmax of the logits before
    any bias, penalty, temperature or truncation, as OpenAI's API and vLLM's "raw logprobs" do:
    they then describe the model, not the request's decoding settings, and never come out -inf
    for a token the filters happened to remove.
    """

    next_token_ids: torch.Tensor  # [B] int64
    logprobs: torch.Tensor  # [B] float32, raw log-prob of each chosen token
    top_logprobs: list[list[tuple[float, int]]] | None  # per row, best (logprob, id) first
    # per request of the batch, where the batch computed prompt log-probabilities
    input_logprobs: list[PromptLogprobs] | None = None


def make_generator(seed: int | None, device: torch.device | str) -> torch.Generator:
    """A generator on `device`, seeded with `seed`, or from the OS's entropy when None."""
    generator = torch.Generator(device=device)
    # 63 bits: manual_seed takes a signed 64-bit value on some backends.
    generator.manual_seed(secrets.randbits(63) if seed is None else seed)
    return generator


class Sampler:
    """Chooses the next token of every row of a batch."""

    def sample(
        self,
        logits: torch.Tensor,
        info: SamplingBatchInfo,
        top_logprobs_nums: list[int] | None = None,
    ) -> SampleOutput:
        """Pick one token per row of `logits` [B, V]; `logits` itself is left unchanged."""
        if info.is_all_greedy and not info.has_logits_processors and not top_logprobs_nums:
            return _greedy_fast_path(logits)
        raw_logprobs = torch.log_softmax(logits.float(), dim=-1)
        processed = info.apply_logits_processors(logits.to(torch.float32, copy=True))
        if info.is_all_greedy:
            next_ids = processed.argmax(dim=-1)
        else:
            probs, ids = filtered_probs(processed, info)
            next_ids = _sample_rows(probs, ids, processed, info)
        chosen = raw_logprobs.gather(1, next_ids.unsqueeze(1)).squeeze(1)
        return SampleOutput(
            next_token_ids=next_ids,
            logprobs=chosen,
            top_logprobs=top_logprobs_of(raw_logprobs, top_logprobs_nums),
        )


def _greedy_fast_path(logits: torch.Tensor) -> SampleOutput:
    """All rows greedy, nothing to apply: one max pass gives the token (first maximum, as
    argmax) and its logit m, so the chosen log-prob m − logsumexp is −log Σ exp(x − m): one
    [B, V] temporary, no full log_softmax (on CPU, max-with-indices is ~2× argmax's speed).
    On the CPU the fused C++ op does both in two passes per row, no temporary (4× faster)."""
    if logits.is_cpu:
        ops = load_fused_ops()
        fused = ops.greedy(logits) if ops is not None else None
        if fused is not None:
            return SampleOutput(next_token_ids=fused[0], logprobs=fused[1], top_logprobs=None)
    logits = logits.float()
    top, next_ids = logits.max(dim=-1)
    chosen = (logits - top.unsqueeze(1)).exp_().sum(dim=-1).log_().neg_()
    return SampleOutput(next_token_ids=next_ids, logprobs=chosen, top_logprobs=None)


# Candidates a truncated row is first filtered among: the `topk` of these is a fraction of the
# vocabulary's full sort (SmolLM2: 49,152 ids, sorted per row per step took most of a sampled
# step on CPU). Rows whose kept set might reach past them fall back to the full sort.
CANDIDATES = 1024


def filtered_probs(
    logits: torch.Tensor, info: SamplingBatchInfo
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Temperature-scaled probabilities with top-k, top-p and min-p applied (unnormalised: the
    draw scales by each row's total), as [B, V] in vocabulary order (ids None), or over each
    row's most likely candidates [B, N] with their vocabulary ids."""
    probs = torch.softmax(logits / info.temperatures, dim=-1)
    if not (info.need_top_k or info.need_top_p or info.need_min_p):
        return probs, None
    found = _filtered_candidates(probs, info)
    return found if found is not None else (_filtered_probs(probs, info), None)


def _filtered_candidates(
    probs: torch.Tensor, info: SamplingBatchInfo
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The filters over each row's `CANDIDATES` most likely ids (more where a row's top-k asks
    for more), or None where a sampled row keeps its last candidate: its kept set may go on past
    them, so only the full sort decides it. Top-p's mass is the whole vocabulary's for rows
    without top-k (the candidates hold only part of it), as the full sort measures it."""
    vocab = probs.shape[1]
    sampled = ~torch.tensor(info.greedy_rows, device=probs.device)
    asked = info.top_ks[sampled & (info.top_ks < vocab)]
    k = max(CANDIDATES, int(asked.max()) if asked.numel() else 0)
    if k >= vocab:
        return None
    cand, ids = probs.topk(k, dim=-1)
    mass = torch.where(
        info.top_ks < vocab,
        cand.masked_fill(
            torch.arange(k, device=probs.device)[None, :] >= info.top_ks[:, None], 0.0
        ).sum(dim=-1),
        probs.sum(dim=-1),
    )
    keep = _keep_sorted(cand, info, mass)
    if bool((keep[:, -1] & sampled).any()):
        return None
    # Draw in vocabulary order, as the full sort's path does: a seeded row then picks the same
    # id whichever path its batch mates send the batch down (n samples, or a re-run whose
    # neighbours differ, stay reproducible).
    ids, order = ids.sort(dim=-1)
    return cand.masked_fill(~keep, 0.0).gather(1, order), ids


def _filtered_probs(probs: torch.Tensor, info: SamplingBatchInfo) -> torch.Tensor:
    """The filters over the whole vocabulary's sort: [B, V] in vocabulary order."""
    sorted_probs, sorted_ids = probs.sort(dim=-1, descending=True)
    keep = _keep_sorted(sorted_probs, info)
    # Scatter the kept flags back to vocabulary order so every row samples the same way.
    keep_vocab = torch.zeros_like(keep).scatter_(1, sorted_ids, keep)
    return probs.masked_fill(~keep_vocab, 0.0)


def _keep_sorted(
    sorted_probs: torch.Tensor, info: SamplingBatchInfo, mass: torch.Tensor | None = None
) -> torch.Tensor:
    """Which positions of descending-sorted probs [B, N] survive the three filters; `mass`:
    each row's probability within its top-k, where the N positions do not hold all of it.

    The filters run in sequence: top-p measures mass within what top-k kept (as HF and vLLM do),
    and the first (most likely) position always survives all three.
    """
    ranks = torch.arange(sorted_probs.shape[1], device=sorted_probs.device)
    keep = ranks.unsqueeze(0) < info.top_ks.unsqueeze(1)
    if info.need_top_p:
        kept = sorted_probs * keep
        mass_before = kept.cumsum(dim=-1) - kept
        total = kept.sum(dim=-1) if mass is None else mass
        budget = info.top_ps.unsqueeze(1) * total.unsqueeze(1)
        # Rows with top_p == 1 are exempt: rounding in the cumsum must not clip their tail.
        within = (mass_before < budget) | (info.top_ps >= 1.0).unsqueeze(1)
        keep &= within
    if info.need_min_p:
        floor = info.min_ps.unsqueeze(1) * sorted_probs[:, :1]
        keep &= sorted_probs >= floor
    keep[:, 0] = True  # e.g. a top_p that rounds to 0 in float32 must not empty the row
    return keep


def _sample_rows(
    probs: torch.Tensor, ids: torch.Tensor | None, logits: torch.Tensor, info: SamplingBatchInfo
) -> torch.Tensor:
    """One draw per sampled row from its (unnormalised) `probs`, each from that row's generator
    (torch's default RNG when None): the inverse of the row's cumulative distribution at one
    uniform number. torch.multinomial draws as many random numbers as the row has entries
    (~3 ms a row over SmolLM2's vocabulary on CPU); one is enough for one sample."""
    next_ids = logits.argmax(dim=-1)
    if all(info.greedy_rows):
        return next_ids
    cdf = probs.cumsum(dim=-1)
    for i, greedy in enumerate(info.greedy_rows):
        if greedy:
            continue
        at = draw_from_cdf(cdf[i], info.generators[i])
        if at is None:
            continue  # nothing left to draw from (a degenerate row): its argmax, never a crash
        next_ids[i] = at if ids is None else ids[i, at]
    return next_ids


def draw_from_cdf(cdf: torch.Tensor, generator: torch.Generator | None) -> int | None:
    """The index one uniform number from `generator` picks in the cumulative (unnormalised)
    distribution `cdf` [N], or None where the row holds no probability."""
    total = cdf[-1:]
    u = torch.rand(1, generator=generator, device=cdf.device, dtype=cdf.dtype)
    if not bool(torch.isfinite(total).all() and (total > 0).all()):
        return None
    at = torch.searchsorted(cdf, u * total, right=True)
    # u * total may round up to the total: stay on the last id with probability > 0.
    at = torch.minimum(at, torch.searchsorted(cdf, total)).clamp_(max=cdf.numel() - 1)
    return int(at[0])


def top_logprobs_of(
    logprobs: torch.Tensor, nums: list[int] | None
) -> list[list[tuple[float, int]]] | None:
    if not nums or max(nums) <= 0:
        return None
    k = min(max(nums), logprobs.shape[1])
    values, ids = torch.topk(logprobs, k, dim=-1)
    values_l, ids_l = values.tolist(), ids.tolist()
    return [list(zip(values_l[i][:n], ids_l[i][:n], strict=True)) for i, n in enumerate(nums)]
