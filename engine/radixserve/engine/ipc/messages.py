"""Every tokenizer ⇄ scheduler ⇄ detokenizer message, as tagged frozen msgspec structs.

Keep logic out of this module: it is the wire contract between the engine's processes.
Per-request fields in batch outputs are parallel lists indexed like `rids`; the detokenizer
turns token-id deltas into text deltas and forwards everything else unchanged, except for a
request it ends on a stop string: that one's ids, logprobs and count are cut at the id that
completed the string, and its later outputs are dropped.
"""

from __future__ import annotations

from typing import Any

import msgspec

from radixserve.engine.ipc.finish_reason import FinishMatchedStr, FinishReason


class _Msg(msgspec.Struct, frozen=True, tag=True, omit_defaults=True):
    pass


class DetokenizeParams(msgspec.Struct, frozen=True, omit_defaults=True):
    """How the text side turns one request's ids into text. Set by the tokenizer side; the
    scheduler carries it to the detokenizer with each output without reading it."""

    skip_special_tokens: bool = True
    no_stop_trim: bool = False
    stop_strs: list[str] = []


class Bootstrap(msgspec.Struct, frozen=True):
    """Prefill/decode disaggregation: where the request's prefill runs (its bootstrap server)
    and the room that names the request on both sides (the router picks all three)."""

    host: str
    port: int
    room: int


class TokenizedGenerateReq(_Msg, frozen=True):
    rid: str
    input_ids: list[int]
    # The fields of a SamplingParams already validated and normalised at the HTTP / Engine edge
    # (the scheduler rebuilds it without checking again).
    sampling_params: dict[str, Any]
    input_text: str | None = None
    return_logprob: bool = False
    top_logprobs_num: int = 0
    logprob_start_len: int = -1  # SGLang's: prompt log-probabilities from this token (-1: none)
    # Send each step's new ids, not only the finished request's: the client streams, or the
    # detokenizer watches the text for stop strings.
    stream: bool = False
    data_parallel_rank: int | None = None  # pinned DP rank (wired in by the DP controller)
    # The answer starts with reasoning (--reasoning-parser): its grammar, if any, constrains
    # only what follows the reasoning's end marker.
    require_reasoning: bool = False
    # The tokenizer's EOS id: the scheduler has no tokenizer; it adds the model config's EOS
    # ids and the request's stop_token_ids.
    eos_token_id: int | None = None
    detokenize: DetokenizeParams = DetokenizeParams()
    bootstrap: Bootstrap | None = None  # set on a prefill or decode server's PD requests


class AbortReq(_Msg, frozen=True):
    rid: str = ""
    abort_all: bool = False


class FinishReq(_Msg, frozen=True):
    """Tokenizer manager → the request's scheduler: the detokenizer ended it on a stop string.
    The scheduler finishes it like an abort but with this reason (its KV cached as on any
    finish); what it still sends for the request is dropped by the detokenizer."""

    rid: str
    reason: FinishMatchedStr


class ExpertDistributionReq(_Msg, frozen=True):
    """/start_expert_distribution_record, /stop_... and /dump_...: action start | stop | dump."""

    action: str


class ExpertDistributionOutput(_Msg, frozen=True):
    """A DP rank's answer; on dump, the kept passes' counts [passes][layers][experts], the
    physical slots' counts [passes][layers][slots] and the placement now [layers][slots]
    (EPLB; slot e is expert e without it). `whole_model`: the counts cover every DP rank's
    tokens (DP attention: the MoE runs over all of them), so one rank's answer is the
    model's."""

    success: bool
    message: str = ""
    counts: list[list[list[int]]] = []
    whole_model: bool = False
    physical_counts: list[list[list[int]]] = []
    physical_to_logical_map: list[list[int]] = []


class FlushCacheReq(_Msg, frozen=True):
    pass


class GetLoadReq(_Msg, frozen=True):
    pass


class GetStateReq(_Msg, frozen=True):
    """Debug/test introspection: pool and cache sizes, cached page hashes."""

    include_pages: bool = False


class FlushCacheOutput(_Msg, frozen=True):
    success: bool
    message: str = ""


class HiCacheLoad(_Msg, frozen=True):
    """HiCache's counters (since start) and levels of one DP rank (mem_cache/hiradix_cache)."""

    device_hit_tokens: int
    host_hit_tokens: int
    storage_hit_tokens: int
    load_back_tokens: int
    load_back_bytes: int
    load_back_seconds: float
    backup_tokens: int
    dropped_tokens: int
    host_used_tokens: int
    host_total_tokens: int
    storage_pending_writes: int = 0
    storage_used_bytes: int = 0
    prefetched_tokens: int = 0
    prefetch_deferrals: int = 0
    prefetch_lost_tokens: int = 0
    prefetch_staged_bytes: int = 0


class ExpertLoad(_Msg, frozen=True):
    """The MoE experts' balance on one DP rank (model_executor/eplb_manager.py): max/mean EP-rank
    load over the recorder's kept passes (1.0 with none), and online EPLB's counters."""

    balancedness: float
    recorded_passes: int
    rebalances: int = 0
    moved_layers: int = 0
    move_seconds: float = 0.0
    max_move_seconds: float = 0.0  # the longest single chunk: the pause it added to one step


class SpecLoad(_Msg, frozen=True):
    """Speculative decoding on one DP rank since start (scheduler/speculation.py)."""

    verify_steps: int  # forward steps that verified drafts
    verified_reqs: int  # request-steps with drafts
    proposed_drafts: int
    accepted_drafts: int
    draft_seconds: float  # looking drafts up
    verify_seconds: float  # the verify steps, forward and acceptance
    accept_length_counts: list[int]  # [n]: request-steps that emitted n tokens

    @property
    def accept_length(self) -> float:
        """Mean tokens a verify emitted per request (accepted drafts + 1); 0 before any."""
        return (self.accepted_drafts + self.verified_reqs) / max(self.verified_reqs, 1)


class LoadOutput(_Msg, frozen=True):
    dp_rank: int
    num_running_reqs: int
    num_waiting_reqs: int
    num_reqs: int
    num_used_tokens: int
    max_total_num_tokens: int
    token_usage: float
    # prefill/decode disaggregation (zero elsewhere): SGLang's load-snapshot queue counts
    num_prefill_bootstrap_queue_reqs: int = 0
    num_prefill_inflight_queue_reqs: int = 0
    num_decode_prealloc_queue_reqs: int = 0
    num_decode_transfer_queue_reqs: int = 0
    kv_transfer_pages_total: int = 0  # pages written (prefill) or received (decode)
    kv_transfer_bytes_total: int = 0
    kv_transfer_seconds_total: float = 0.0  # prefill: time inside the transfer engine
    kv_transfers_total: int = 0  # rooms concluded with every page moved
    kv_transfer_failed_total: int = 0
    bootstrap_failed_total: int = 0  # rooms refused or lost at bootstrap
    hicache: HiCacheLoad | None = None  # --enable-hierarchical-cache only
    experts: ExpertLoad | None = None  # the expert recorder or EPLB only
    spec: SpecLoad | None = None  # --speculative-algorithm only


class StateOutput(_Msg, frozen=True):
    max_total_num_tokens: int
    available_tokens: int
    evictable_tokens: int
    protected_tokens: int
    num_running_reqs: int
    num_waiting_reqs: int
    page_hashes: list[int] = []
    dp_rank: int = 0


class InputLogprobs(_Msg, frozen=True):
    """A request's prompt log-probabilities from its logprob_start_len on, sent once."""

    token_ids: list[int]
    token_logprobs: list[float | None]  # None: the first prompt token (it has no context)
    top_logprobs: list[list[tuple[float, int]]] = []  # per token where top_logprobs_num > 0


class BatchTokenIDOutput(_Msg, frozen=True):
    """Scheduler → detokenizer: new token ids per request since the last send."""

    rids: list[str]
    new_output_ids: list[list[int]]
    finished_reasons: list[FinishReason | None]
    prompt_tokens: list[int]
    completion_tokens: list[int]
    cached_tokens: list[int]
    retractions: list[int]
    detokenize: list[DetokenizeParams]
    prompt_tail: list[list[int]]  # last prompt ids: left context for the first decode
    output_token_logprobs: list[list[float]] = []
    output_top_logprobs: list[list[list[tuple[float, int]]]] = []
    input_logprobs: list[InputLogprobs | None] = []  # once per request, when all are known
    queue_times: list[float | None] = []  # seconds from arrival to first prefill (None: yet)
    spec_verify_ct: list[int] = []  # speculative decoding: verifies with drafts so far
    spec_accepted_drafts: list[int] = []  # and the drafts they accepted


class BatchStrOutput(_Msg, frozen=True):
    """Detokenizer → tokenizer manager: text deltas (stop strings already trimmed). A
    `FinishMatchedStr` here was found by the detokenizer: the scheduler does not know yet."""

    rids: list[str]
    text_deltas: list[str]
    new_output_ids: list[list[int]]
    finished_reasons: list[FinishReason | None]
    prompt_tokens: list[int]
    completion_tokens: list[int]
    cached_tokens: list[int]
    retractions: list[int]
    output_token_logprobs: list[list[float]] = []
    output_top_logprobs: list[list[list[tuple[float, int]]]] = []
    input_logprobs: list[InputLogprobs | None] = []
    queue_times: list[float | None] = []
    spec_verify_ct: list[int] = []
    spec_accepted_drafts: list[int] = []


SchedulerInput = (
    TokenizedGenerateReq
    | AbortReq
    | FinishReq
    | FlushCacheReq
    | GetLoadReq
    | GetStateReq
    | ExpertDistributionReq
)
TokenizerInput = (
    BatchStrOutput | FlushCacheOutput | LoadOutput | StateOutput | ExpertDistributionOutput
)
DetokenizerInput = BatchTokenIDOutput
