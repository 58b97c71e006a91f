"""Req: one generation request as the scheduler tracks it (CPU-side, no tensors of its own
but the KV slot indices of its prefix).

Lengths to keep apart: `origin_input_ids` (prompt), `output_ids` (generated so far),
`fill_ids` (what the next extend computes up to: prompt + outputs, possibly cut to a chunk),
`prefix_indices` (KV slots of the already computed / cached part of fill_ids).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from radixserve.engine.constrained import BaseGrammarObject, GrammarKey
from radixserve.engine.ipc.finish_reason import (
    FinishAbort,
    FinishLength,
    FinishMatchedToken,
    FinishReason,
)
from radixserve.engine.ipc.messages import Bootstrap, DetokenizeParams
from radixserve.engine.sampling import SamplingParams, SamplingRow


@dataclass(frozen=True, slots=True)
class StopCriteria:
    """What ends a request here besides length: EOS and stop token ids. Stop strings are the
    text side's: the detokenizer finds them, and the request is ended by a FinishReq."""

    stop_token_ids: frozenset[int]


@dataclass(eq=False, slots=True)
class Req:
    rid: str
    origin_input_ids: list[int]
    sampling_params: SamplingParams
    stop: StopCriteria
    generator: torch.Generator | None = None
    origin_input_text: str | None = None
    return_logprob: bool = False
    top_logprobs_num: int = 0
    logprob_start_len: int = -1  # prompt log-probabilities from this token on (-1: none)
    arrival_time: float = 0.0
    queue_time: float | None = None  # arrival → first admission into a prefill batch (s)
    stream: bool = False  # send each step's new ids (else only when finished)
    detokenize: DetokenizeParams = DetokenizeParams()  # carried to the detokenizer, unread
    bootstrap: Bootstrap | None = None  # prefill/decode disaggregation: its peer and room
    # constrained decoding: what the output must match, and this request's place in it (set
    # once the grammar compiled; it has accepted every id in output_ids)
    grammar_key: GrammarKey | None = None
    grammar: BaseGrammarObject | None = None
    require_reasoning: bool = False  # the grammar starts after the reasoning's end marker

    send_offset: int = 0  # output ids already sent to the detokenizer
    # overlap: tokens sampled by launched batches but not yet appended to output_ids
    num_inflight: int = 0
    pending_token: int = 0  # placeholder (−slot) of the newest in-flight token

    output_ids: list[int] = field(default_factory=list)
    fill_ids: list[int] = field(default_factory=list)
    # memory
    req_pool_idx: int | None = None
    prefix_indices: torch.Tensor = field(default_factory=lambda: torch.empty(0, dtype=torch.int64))
    last_node: Any = None
    cache_protected_len: int = 0
    kv_allocated_len: int = 0  # positions with a KV slot in req_to_token[req_pool_idx]
    extend_input_len: int = 0
    storage_prefetched: bool = False  # HiCache: its storage read was started (once)
    # status
    finished_reason: FinishReason | None = None
    to_finish: FinishReason | None = None
    is_retracted: bool = False
    retraction_count: int = 0
    cached_tokens: int = 0
    # speculative decoding: verifies this request had drafts in, and drafts it accepted
    spec_verify_ct: int = 0
    spec_accepted_drafts: int = 0
    spec_draft_kv_len: int = 0  # STANDALONE: positions whose KV the draft model computed
    spec_draft_len: int = 0  # drafts it gets next (speculation.Speculator); 0: the most
    spec_pause: int = 0  # decode steps it drafts nothing (its drafts kept failing)
    spec_backoff: int = 0  # the last such pause, doubled when it happens again
    # outputs
    # prompt log-probabilities (logprob_start_len ≥ 0): the next prompt position whose hidden
    # state gives one (scheduled up to here; no cached prefix is reused past it), the values
    # so far (None for the first prompt token, which has no context), whether they were sent
    input_logprob_next: int = 0
    input_token_logprobs: list[float | None] = field(default_factory=list)
    input_top_logprobs: list[list[tuple[float, int]]] = field(default_factory=list)
    input_logprobs_sent: bool = False
    output_token_logprobs: list[float] = field(default_factory=list)
    output_top_logprobs: list[list[tuple[float, int]]] = field(default_factory=list)

    @property
    def seqlen(self) -> int:
        return len(self.origin_input_ids) + len(self.output_ids) + self.num_inflight

    def last_token(self) -> int:
        """Input of the next decode step: the newest token, or its placeholder if in flight."""
        return self.pending_token if self.num_inflight else self.output_ids[-1]

    def finished(self) -> bool:
        return self.finished_reason is not None

    def full_ids(self) -> list[int]:
        return self.origin_input_ids + self.output_ids

    def __post_init__(self) -> None:
        if self.wants_input_logprobs:
            start = self.logprob_start_len
            self.input_logprob_next = max(start, 1) - 1
            if start == 0:
                self.input_token_logprobs.append(None)
                self.input_top_logprobs.append([])

    @property
    def wants_input_logprobs(self) -> bool:
        return self.return_logprob and self.logprob_start_len >= 0

    def input_logprobs_complete(self) -> bool:
        """Every prompt token from logprob_start_len on has its log-probability."""
        want = len(self.origin_input_ids) - self.logprob_start_len
        return self.wants_input_logprobs and len(self.input_token_logprobs) == want

    def init_next_round_input(self) -> None:
        """Everything with no KV yet is computed next: prompt + outputs beyond the prefix."""
        self.fill_ids = self.full_ids()
        self.extend_input_len = len(self.fill_ids) - len(self.prefix_indices)

    def sampling_row(self) -> SamplingRow:
        return SamplingRow(
            params=self.sampling_params,
            prompt_ids=self.origin_input_ids,
            output_ids=self.output_ids,
            stop_token_ids=self.stop.stop_token_ids,
            generator=self.generator,
        )

    def check_finished(self) -> None:
        """Set `finished_reason` after a token was appended (SGLang's order of checks)."""
        if self.finished():
            return
        if self.to_finish is not None:
            self.finished_reason, self.to_finish = self.to_finish, None
            return
        params = self.sampling_params
        if len(self.output_ids) >= params.max_new_tokens:
            self.finished_reason = FinishLength(params.max_new_tokens)
            return
        last = self.output_ids[-1]
        stopped = not params.ignore_eos and last in self.stop.stop_token_ids
        if stopped or (self.grammar is not None and self.grammar.is_terminated()):
            self.finished_reason = FinishMatchedToken(last)

    def accept_grammar_token(self, token_id: int, vocab_size: int) -> None:
        """Advance the grammar past the newly appended `token_id`. A grammar that allowed no
        token of the vocabulary (the sampler then had nothing to pick from) ends the request
        with a 400 naming its field: the request asked for text this model cannot write. Any
        other forbidden token means the mask was bypassed: a 500."""
        if self.grammar is None or self.grammar.accept_token(token_id):
            return
        if self.grammar.allows_no_token(vocab_size):
            field = self.grammar_key.field if self.grammar_key is not None else "grammar"
            why = f"{field}: no token of the model's vocabulary can continue the grammar"
            self.to_finish = FinishAbort(f"{why} after {len(self.output_ids) - 1} tokens", 400)
        else:
            self.to_finish = FinishAbort(f"token {token_id} violates the request's grammar", 500)
