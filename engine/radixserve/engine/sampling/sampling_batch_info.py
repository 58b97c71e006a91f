"""Per-batch sampling state: one forward step's sampling parameters laid out as tensors.

Owns `SamplingRow` (what the scheduler knows about one running request at sampling time) and
`SamplingBatchInfo`, which turns a list of rows into device tensors once per step and applies the
logits processors (logit bias, repetition / frequency / presence penalties, min-new-tokens, the
grammar's token bitmask) to a [B, V] logits tensor. Choosing tokens from the processed logits
is `sampler`'s job.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from .sampling_params import SamplingParams
from .vocab_mask import apply_vocab_mask


@dataclass(frozen=True, slots=True)
class SamplingRow:
    """One request's sampling inputs for this step.

    `stop_token_ids` is already the union of the model's EOS ids and `params.stop_token_ids`; the
    caller merges them because only it knows the model.
    """

    params: SamplingParams
    prompt_ids: list[int]
    output_ids: list[int]
    stop_token_ids: frozenset[int]
    generator: torch.Generator | None


@dataclass(slots=True)
class SamplingBatchInfo:
    """A batch's sampling parameters as tensors on the logits' device (B rows, V vocab)."""

    vocab_size: int
    temperatures: torch.Tensor  # [B, 1] float32; 1.0 on greedy rows
    top_ks: torch.Tensor  # [B] int64; -1 already replaced by V, greedy rows hold 1
    top_ps: torch.Tensor  # [B] float32
    min_ps: torch.Tensor  # [B] float32
    greedy_rows: list[bool]
    is_all_greedy: bool
    # The need_* flags look only at non-greedy rows: greedy rows take the argmax regardless.
    need_top_k: bool
    need_top_p: bool
    need_min_p: bool
    frequency_penalties: torch.Tensor  # [B] float32
    presence_penalties: torch.Tensor  # [B] float32
    repetition_penalties: torch.Tensor  # [B] float32
    # The [B, V] tensors below are None when no row needs them, to skip the work entirely.
    output_counts: torch.Tensor | None  # float32 counts of output tokens (frequency/presence)
    seen_mask: torch.Tensor | None  # bool, prompt + output tokens (repetition penalty)
    min_tokens_mask: torch.Tensor | None  # bool, stop ids of rows still under min_new_tokens
    logit_bias: torch.Tensor | None  # float32
    generators: list[torch.Generator | None]
    # Constrained decoding: [B, ceil(V/32)] int32 token bitmask (bit set = allowed; rows
    # without a grammar all ones), or None. Set by the worker just before sampling.
    vocab_mask: torch.Tensor | None = None

    @property
    def batch_size(self) -> int:
        return len(self.greedy_rows)

    @classmethod
    def build(
        cls, rows: Sequence[SamplingRow], vocab_size: int, device: torch.device
    ) -> SamplingBatchInfo:
        """Lay `rows` out as tensors. Cost is O(B·V + total prompt/output tokens) per call."""
        params = [r.params for r in rows]
        greedy = [p.is_greedy for p in params]
        sampled = [p for p in params if not p.is_greedy]
        effective = [_effective_distribution(p, vocab_size) for p in params]

        def floats(values: Sequence[float]) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.float32, device=device)

        return cls(
            vocab_size=vocab_size,
            temperatures=floats([e[0] for e in effective]).unsqueeze(1),
            top_ks=torch.tensor([e[1] for e in effective], dtype=torch.int64, device=device),
            top_ps=floats([e[2] for e in effective]),
            min_ps=floats([e[3] for e in effective]),
            greedy_rows=greedy,
            is_all_greedy=all(greedy),
            need_top_k=any(_effective_top_k(p.top_k, vocab_size) < vocab_size for p in sampled),
            need_top_p=any(p.top_p < 1.0 for p in sampled),
            need_min_p=any(p.min_p > 0.0 for p in sampled),
            frequency_penalties=floats([p.frequency_penalty for p in params]),
            presence_penalties=floats([p.presence_penalty for p in params]),
            repetition_penalties=floats([p.repetition_penalty for p in params]),
            output_counts=_output_counts(rows, vocab_size, device),
            seen_mask=_seen_mask(rows, vocab_size, device),
            min_tokens_mask=_min_tokens_mask(rows, vocab_size, device),
            logit_bias=_logit_bias(rows, vocab_size, device),
            generators=[r.generator for r in rows],
        )

    @property
    def has_logits_processors(self) -> bool:
        """Whether any row has a bias, penalty or min-new-tokens mask to apply."""
        masks = (
            self.logit_bias,
            self.seen_mask,
            self.output_counts,
            self.min_tokens_mask,
            self.vocab_mask,
        )
        return any(m is not None for m in masks)

    def apply_logits_processors(self, logits: torch.Tensor) -> torch.Tensor:
        """Apply bias, penalties, the min-new-tokens mask and the grammar's token bitmask to
        float32 logits [B, V].

        Works in place where it can; callers must use the returned tensor. `ignore_eos` is not
        looked at: the caller leaves EOS out of the stop ids of such rows.
        """
        # The grammar is the one hard constraint: a row that bias, penalties or min_new_tokens
        # leave with no token the grammar allows falls back to the grammar alone (below).
        before = logits.clone() if self.vocab_mask is not None else None
        if self.logit_bias is not None:
            logits.add_(self.logit_bias)
        if self.seen_mask is not None:
            # HF-style: shrink positive logits and grow negative ones, so p > 1 always lowers a
            # seen token's probability whatever the sign of its logit.
            p = self.repetition_penalties.unsqueeze(1)
            penalised = torch.where(logits > 0, logits / p, logits * p)
            logits = torch.where(self.seen_mask, penalised, logits)
        if self.output_counts is not None:
            logits.sub_(self.frequency_penalties.unsqueeze(1) * self.output_counts)
            present = (self.output_counts > 0).to(logits.dtype)
            logits.sub_(self.presence_penalties.unsqueeze(1) * present)
        if self.min_tokens_mask is not None:
            logits.masked_fill_(self.min_tokens_mask, float("-inf"))
        if self.vocab_mask is not None:  # last: no bias can bring back a forbidden token
            apply_vocab_mask(logits, self.vocab_mask)
            dead = ~torch.isfinite(logits).any(dim=-1)
            if before is not None and bool(dead.any()):
                apply_vocab_mask(before, self.vocab_mask)
                logits = torch.where(dead.unsqueeze(1), before, logits)
        return logits


def _effective_top_k(top_k: int, vocab_size: int) -> int:
    return vocab_size if top_k == -1 else min(top_k, vocab_size)


def _effective_distribution(p: SamplingParams, vocab_size: int) -> tuple[float, int, float, float]:
    """(temperature, top_k, top_p, min_p) as the sampler should see them.

    Greedy rows get neutral values whether or not `normalize` ran, so a temperature of 0 never
    reaches a division.
    """
    if p.is_greedy:
        return 1.0, 1, 1.0, 0.0
    return p.temperature, _effective_top_k(p.top_k, vocab_size), p.top_p, p.min_p


def _flat_index(
    token_lists: Sequence[Sequence[int]], device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """(row, token) index pairs for every token of every row, ready for `index_put_`."""
    rows = [i for i, toks in enumerate(token_lists) for _ in toks]
    toks = [t for toks in token_lists for t in toks]
    return (
        torch.tensor(rows, dtype=torch.int64, device=device),
        torch.tensor(toks, dtype=torch.int64, device=device),
    )


def _output_counts(
    rows: Sequence[SamplingRow], vocab_size: int, device: torch.device
) -> torch.Tensor | None:
    if all(r.params.frequency_penalty == 0 and r.params.presence_penalty == 0 for r in rows):
        return None
    counts = torch.zeros(len(rows), vocab_size, dtype=torch.float32, device=device)
    index = _flat_index([r.output_ids for r in rows], device)
    ones = torch.ones(index[0].numel(), dtype=torch.float32, device=device)
    counts.index_put_(index, ones, accumulate=True)
    return counts


def _seen_mask(
    rows: Sequence[SamplingRow], vocab_size: int, device: torch.device
) -> torch.Tensor | None:
    if all(r.params.repetition_penalty == 1.0 for r in rows):
        return None
    mask = torch.zeros(len(rows), vocab_size, dtype=torch.bool, device=device)
    index = _flat_index([[*r.prompt_ids, *r.output_ids] for r in rows], device)
    mask[index] = True
    return mask


def _min_tokens_mask(
    rows: Sequence[SamplingRow], vocab_size: int, device: torch.device
) -> torch.Tensor | None:
    # Stop ids past the logits' width cannot be sampled anyway, so they need no masking.
    blocked = [
        [t for t in r.stop_token_ids if 0 <= t < vocab_size]
        if len(r.output_ids) < r.params.min_new_tokens
        else []
        for r in rows
    ]
    if not any(blocked):
        return None
    mask = torch.zeros(len(rows), vocab_size, dtype=torch.bool, device=device)
    mask[_flat_index(blocked, device)] = True
    return mask


def _logit_bias(
    rows: Sequence[SamplingRow], vocab_size: int, device: torch.device
) -> torch.Tensor | None:
    if not any(r.params.logit_bias for r in rows):
        return None
    bias = torch.zeros(len(rows), vocab_size, dtype=torch.float32, device=device)
    biases = [r.params.logit_bias or {} for r in rows]
    index = _flat_index([list(b) for b in biases], device)
    values = [v for b in biases for v in b.values()]
    bias[index] = torch.tensor(values, dtype=torch.float32, device=device)
    return bias
