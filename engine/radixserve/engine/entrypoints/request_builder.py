"""The edge's one validation step: prompts + raw sampling parameters → validated, normalised,
n-expanded `GenerateInput`s. Used by every route, the offline Engine and EngineCore; nothing
behind it validates again.

Every client mistake raises `InvalidRequest` (a ValueError whose message starts with the field
name); anything else that escapes from here is a bug.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any, NamedTuple

from radixserve.engine.sampling import SamplingParams
from radixserve.engine.tokenizer.io_struct import GenerateInput
from radixserve.protocol.http_api import MAX_N, MAX_TOP_LOGPROBS
from radixserve.protocol.request_fields import is_token_id

Tokenize = Callable[[str], list[int]]


class InvalidRequest(ValueError):
    """A client error found while validating a request; `field` is the offending field."""

    @property
    def field(self) -> str:
        head, sep, _ = str(self).partition(":")
        return head if sep and " " not in head.strip() else "body"


@dataclass(frozen=True, slots=True)
class ServerLimits:
    """What a request is checked against (from the scheduler's start-up handshake)."""

    context_len: int
    max_req_input_len: int
    vocab_size: int
    dp_size: int = 1  # data_parallel_rank must be in [0, dp_size)
    # what a request gets for the sampling parameters it leaves unset (--generation-config)
    sampling_defaults: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))


class Prompt(NamedTuple):
    text: str | None  # None when the client sent token ids
    input_ids: list[int]


@dataclass(frozen=True, slots=True)
class OutputOptions:
    """Per-call options that apply to every prompt of the call."""

    stream: bool = False
    return_logprob: bool = False
    top_logprobs_num: int = 0
    data_parallel_rank: int | None = None  # pin every prompt of the call to this DP rank


def native_prompts(
    tokenize: Tokenize, text: Any, input_ids: Any, text_field: str = "text"
) -> tuple[list[Prompt], bool]:
    """Exactly one of text / input_ids, single or batched → (prompts, is_single)."""
    if (text is None) == (input_ids is None):
        raise InvalidRequest(f"{text_field}: pass exactly one of '{text_field}' or 'input_ids'")
    if text is not None:
        texts = [text] if isinstance(text, str) else text
        if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
            raise InvalidRequest(f"{text_field}: expected a string or a list of strings")
        return [Prompt(t, tokenize(t)) for t in texts], isinstance(text, str)
    single = isinstance(input_ids, list) and bool(input_ids) and is_token_id(input_ids[0])
    lists = [input_ids] if single else input_ids
    if not isinstance(lists, list) or not all(isinstance(x, list) for x in lists):
        raise InvalidRequest("input_ids: expected a list of ints or a list of lists")
    if not all(is_token_id(t) for x in lists for t in x):
        raise InvalidRequest("input_ids: token ids must be integers")
    return [Prompt(None, list(x)) for x in lists], single


def per_prompt_params(sampling_params: Any, num_prompts: int) -> list[dict[str, Any]]:
    """One sampling-parameter object for all prompts, or a list with one per prompt."""
    if sampling_params is None:
        return [{} for _ in range(num_prompts)]
    if isinstance(sampling_params, list):
        if len(sampling_params) != num_prompts:
            raise InvalidRequest(
                f"sampling_params: {len(sampling_params)} entries for {num_prompts} prompts"
            )
        items = sampling_params
    else:
        items = [sampling_params] * num_prompts
    if not all(isinstance(p, dict) for p in items):
        raise InvalidRequest("sampling_params: expected an object or a list of objects")
    return [dict(p) for p in items]


def parse_params(raw: dict[str, Any], vocab_size: int) -> SamplingParams:
    """SamplingParams from a request's object: types, ranges, then the canonical form."""
    for key, value in raw.items():  # the scheduler's messages carry int64 at most
        if is_token_id(value) and not -(2**63) <= value < 2**63:
            raise InvalidRequest(f"{key}: integer out of range, got {value}")
    try:
        params = SamplingParams.from_dict(raw)
        params.verify(vocab_size)  # before normalize, which rewrites temperature 0 → top_k 1
    except ValueError as exc:
        raise InvalidRequest(str(exc)) from None
    params.normalize()
    return params


def check_prompt(ids: list[int], max_new_tokens: int, limits: ServerLimits) -> None:
    """SGLang's checks: prompt and prompt + output vs context (the vocabulary: `build_inputs`)."""
    n, ctx = len(ids), limits.context_len
    if n == 0:
        raise InvalidRequest("input_ids: the input is empty.")
    if n >= ctx:
        raise InvalidRequest(
            f"input_ids: The input ({n} tokens) is longer than the model's context length "
            f"({ctx} tokens)."
        )
    if n > limits.max_req_input_len:  # a KV pool smaller than the context is the bound
        raise InvalidRequest(
            f"input_ids: The input ({n} tokens) is longer than this server's limit of "
            f"{limits.max_req_input_len} tokens (its KV pool is smaller than the context)."
        )
    if n + max_new_tokens >= ctx:
        raise InvalidRequest(
            f"max_new_tokens: Requested token count exceeds the model's maximum context length "
            f"of {ctx} tokens. You requested a total of {n + max_new_tokens} tokens: {n} tokens "
            f"from the input messages and {max_new_tokens} tokens for the completion. Please "
            "reduce the number of tokens in the input messages or the completion to fit within "
            "the limit."
        )


def build_inputs(
    prompts: list[Prompt],
    raw_params: list[dict[str, Any]],
    limits: ServerLimits,
    options: OutputOptions,
    check_lengths: bool = True,
) -> list[GenerateInput]:
    """Validate every prompt (the whole call fails before anything is scheduled) and expand
    n: sample i of a prompt uses seed + i when a seed is given (distinct, reproducible).

    Without `check_lengths` (the in-process EngineCore) an empty or overlong prompt is left to
    the scheduler, which finishes it with an abort reason and runs the rest of the batch.
    """
    top = options.top_logprobs_num
    if not 0 <= top <= MAX_TOP_LOGPROBS:
        raise InvalidRequest(f"top_logprobs_num: must be in [0, {MAX_TOP_LOGPROBS}], got {top}")
    want_lp = options.return_logprob or options.top_logprobs_num > 0
    check_dp_rank(options.data_parallel_rank, limits.dp_size)
    out: list[GenerateInput] = []
    for prompt, raw in zip(prompts, raw_params, strict=True):
        params = parse_params({**limits.sampling_defaults, **raw}, limits.vocab_size)
        if params.n > MAX_N:  # each sample is a request of its own: bound the fan-out
            raise InvalidRequest(f"n: must be <= {MAX_N}, got {params.n}")
        if any(not 0 <= t < limits.vocab_size for t in prompt.input_ids):
            raise InvalidRequest(f"input_ids: token ids must be in [0, {limits.vocab_size})")
        if check_lengths:
            check_prompt(prompt.input_ids, params.max_new_tokens, limits)
        seed = params.sampling_seed
        for i in range(params.n):
            sample = replace(params, n=1, sampling_seed=None if seed is None else seed + i)
            out.append(
                GenerateInput(
                    prompt.input_ids,
                    sample,
                    prompt.text,
                    options.stream,
                    want_lp,
                    options.top_logprobs_num,
                    data_parallel_rank=options.data_parallel_rank,
                )
            )
    return out


def check_dp_rank(rank: object, dp_size: int) -> None:
    """`data_parallel_rank` (SGLang's and the router's field) is None or in [0, dp_size)."""
    if rank is None:
        return
    if not isinstance(rank, int) or isinstance(rank, bool) or not 0 <= rank < dp_size:
        raise InvalidRequest(
            f"data_parallel_rank: must be an integer in [0, {dp_size}), got {rank!r}"
        )
