"""The request and output types between the HTTP edge and the TokenizerManager.

`entrypoints/` builds `GenerateInput`s from validated requests and reads `GenerateChunk`s back;
the TokenizerManager turns one into a scheduler message and the detokenizer's deltas into the
other. They live here, not in tokenizer_manager.py, so the edge needs no manager to name them.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

import msgspec

from radixserve.engine.ipc.finish_reason import FinishReason
from radixserve.engine.ipc.messages import (
    Bootstrap,
    DetokenizeParams,
    InputLogprobs,
    TokenizedGenerateReq,
)
from radixserve.engine.sampling import SamplingParams


class OutputLoopDied(RuntimeError):
    """The output loop crashed: no output can reach this request any more."""


@dataclass(slots=True)
class GenerateInput:
    """One validated prompt (n > 1 already expanded into n inputs; params normalised)."""

    input_ids: list[int]
    sampling_params: SamplingParams
    text: str | None = None
    stream: bool = False
    return_logprob: bool = False
    top_logprobs_num: int = 0
    logprob_start_len: int = -1  # prompt log-probabilities from this token on (-1: none)
    rid: str = field(default_factory=lambda: uuid.uuid4().hex)
    data_parallel_rank: int | None = None  # pinned DP rank (validated at the edge)
    bootstrap: Bootstrap | None = None  # prefill/decode disaggregation (validated at the edge)
    require_reasoning: bool = False  # a grammar applies only after the reasoning's end

    def tokenized(self, eos_token_id: int | None) -> TokenizedGenerateReq:
        """The scheduler's message for this input (`eos_token_id`: the tokenizer's)."""
        params = self.sampling_params
        stop_strs = params.stop_strs
        return TokenizedGenerateReq(
            rid=self.rid,
            input_ids=self.input_ids,
            sampling_params=msgspec.to_builtins(params),
            input_text=self.text,
            return_logprob=self.return_logprob,
            top_logprobs_num=self.top_logprobs_num,
            logprob_start_len=self.logprob_start_len,
            # The detokenizer finds stop strings in the text, so it needs every step's ids.
            stream=self.stream or bool(stop_strs),
            data_parallel_rank=self.data_parallel_rank,
            require_reasoning=self.require_reasoning,
            eos_token_id=eos_token_id,
            detokenize=DetokenizeParams(params.skip_special_tokens, params.no_stop_trim, stop_strs),
            bootstrap=self.bootstrap,
        )


class GenerateChunk(msgspec.Struct, frozen=True):
    """What one output batch brought to one request: deltas plus its running counts."""

    rid: str
    text_delta: str
    output_ids: list[int]  # the new ids only
    finish_reason: FinishReason | None
    prompt_tokens: int
    completion_tokens: int  # all generated so far
    cached_tokens: int
    total_retractions: int
    token_logprobs: list[float] = []  # aligned with output_ids
    top_logprobs: list[list[tuple[float, int]]] = []
    input_logprobs: InputLogprobs | None = None  # the prompt's, on the first chunk after prefill
    e2e_latency: float | None = None  # set on the final chunk
    spec_verify_ct: int = 0  # speculative decoding: verifies with drafts so far
    spec_accepted_drafts: int = 0
