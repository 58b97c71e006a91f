"""ModelWorker: one batch through the model and the sampler (SGLang's TpModelWorker role).

The scheduler decides what runs; the worker runs it. It owns the Sampler and the agreement of
sampled ids across attention-TP ranks, so the scheduler never sees logits. A GenerationBatch
is built once and not changed after: under overlap scheduling the decode inputs are only
known when the forward starts, so the worker is handed them then and runs on a copy of the
ForwardBatch that carries them.
"""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import torch

from radixserve.engine.layers.logits_processor import InputLogprobValues
from radixserve.engine.sampling import PromptLogprobs, SampleOutput, Sampler, SamplingBatchInfo
from radixserve.engine.speculative import VerifyOutput, verify_drafts

if TYPE_CHECKING:
    from radixserve.engine.forward_batch import ForwardBatch
    from radixserve.engine.model_executor.model_runner import ModelRunner


@dataclass(frozen=True, slots=True)
class GenerationBatch:
    """What one forward-and-sample needs (SGLang's ModelWorkerBatch)."""

    forward_batch: ForwardBatch
    sampling_info: SamplingBatchInfo
    top_logprobs_nums: list[int] | None  # per row; None when no row asks for any
    # Constrained rows: the grammar's token bitmask ([B, ceil(V/32)] int32, CPU), known only
    # once the previous batch's tokens advanced the grammars. Under overlap the scheduler
    # thread sets it while this batch's forward runs (SGLang's delayed sampling).
    vocab_mask: Future[torch.Tensor | None] | None = None
    # A speculative verify (forward mode TARGET_VERIFY): each request's draft tokens; the
    # sampling info and top_logprobs_nums then have one row per position (Σ len + 1)
    drafts: list[list[int]] | None = None


class ModelWorker:
    """Runs GenerationBatches on one ModelRunner; called from one thread at a time."""

    def __init__(self, runner: ModelRunner) -> None:
        self.runner = runner
        self.sampler = Sampler()

    def forward_batch_generation(
        self, batch: GenerationBatch, input_ids: torch.Tensor | None = None
    ) -> SampleOutput | VerifyOutput:
        """Forward, sample (or verify drafts) and agree the chosen ids across attention-TP
        ranks.

        `input_ids`, when given, replace the batch's (overlap: placeholders resolved)."""
        fb = batch.forward_batch
        if input_ids is not None:
            fb = replace(fb, input_ids=input_ids)
        forward = self.runner.forward(fb)
        logits = forward.next_token_logits
        info = batch.sampling_info
        if batch.drafts is not None:
            verified = verify_drafts(logits, info, batch.drafts, batch.top_logprobs_nums)
            return self._agree_verified(verified)
        if batch.vocab_mask is not None:  # the forward ran; now the grammars must be known
            info = replace(info, vocab_mask=batch.vocab_mask.result())
        out = self.sampler.sample(logits, info, batch.top_logprobs_nums)
        self.runner.sync_sampled(out.next_token_ids)
        if fb.input_logprobs is not None and forward.input_logprobs is not None:
            per_req = split_prompt_logprobs(forward.input_logprobs, fb.input_logprobs.counts)
            out = replace(out, input_logprobs=per_req)
        return out

    def _agree_verified(self, out: VerifyOutput) -> VerifyOutput:
        """Every attention-TP rank takes rank 0's accepted tokens (their logits may differ in
        the last bits); a rank whose own differ keeps its log-probabilities where they line
        up (only rank 0's are reported)."""
        width = max(len(t) for t in out.tokens)
        packed = torch.full((len(out.tokens), width), -1, dtype=torch.int64)
        for i, emitted in enumerate(out.tokens):
            packed[i, : len(emitted)] = torch.tensor(emitted, dtype=torch.int64)
        agreed: list[list[int]] = self.runner.sync_sampled(packed).tolist()
        tokens = [[t for t in row if t >= 0] for row in agreed]
        if tokens == out.tokens:
            return out
        logprobs = [
            (lp + [0.0] * len(t))[: len(t)] for lp, t in zip(out.logprobs, tokens, strict=True)
        ]
        return VerifyOutput(
            tokens, logprobs, None, torch.tensor([t[-1] for t in tokens], dtype=torch.int64)
        )

    def forward_idle(self, forward_batch: ForwardBatch) -> None:
        """DP attention: join the other DP ranks' collectives with nothing to compute."""
        self.runner.forward(forward_batch)


def split_prompt_logprobs(values: InputLogprobValues, counts: list[int]) -> list[PromptLogprobs]:
    """A forward's prompt log-probabilities, cut into each request's rows (`counts`)."""
    tokens: list[float] = values.token_logprobs.tolist()
    tops = values.top_logprobs
    out: list[PromptLogprobs] = []
    start = 0
    for n in counts:
        out.append(PromptLogprobs(tokens[start : start + n], tops[start : start + n]))
        start += n
    return out
