"""The edge's one validation step: prompts + raw sampling parameters → validated, normalised,
n-expanded `GenerateInput`s. Used by every route, the offline Engine and EngineCore; nothing
behind it validates again.

Every client mistake raises `InvalidRequest` (a ValueError whose message starts with the field
name); anything else that escapes from here is a bug.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any, NamedTuple

# check_grammar builds xgrammar grammars in the event loop: import xgrammar with the server,
# not during the first constrained request (the scheduler imports it only when it compiles).
import xgrammar  # noqa: F401

from radixserve.engine.constrained import check_grammar
from radixserve.engine.disaggregation.wire import FAKE_BOOTSTRAP_HOST
from radixserve.engine.ipc.messages import Bootstrap
from radixserve.engine.sampling import SamplingParams
from radixserve.engine.sampling.sampling_params import GRAMMAR_FIELDS
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
    grammar_backend: str = "xgrammar"  # "none": constrained requests are refused
    # what a request gets for the sampling parameters it leaves unset (--generation-config)
    sampling_defaults: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    bootstrap_port: int = 8998  # --disaggregation-bootstrap-port: a request's port when it has none


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
    bootstrap: BootstrapFields | None = None  # prefill/decode disaggregation, as sent
    # the answer opens with reasoning (--reasoning-parser): a grammar applies after </think>
    require_reasoning: bool = False
    # SGLang's: log-probabilities of the prompt's tokens from this one on (-1: none); with
    # return_logprob only
    logprob_start_len: int = -1


@dataclass(frozen=True, slots=True)
class BootstrapFields:
    """SGLang's `bootstrap_host` / `bootstrap_port` / `bootstrap_room` as the client sent them:
    each a scalar (every prompt) or a list with one entry per prompt."""

    host: Any = None
    port: Any = None
    room: Any = None

    @classmethod
    def of(cls, body: Mapping[str, Any]) -> BootstrapFields | None:
        fields = cls(
            body.get("bootstrap_host"), body.get("bootstrap_port"), body.get("bootstrap_room")
        )
        return None if fields == cls() else fields

    def for_prompt(self, i: int, num_prompts: int, default_port: int) -> Bootstrap | None:
        """Prompt i's checked fields; None for SGLang's fake host (run co-located)."""
        host = _item(self.host, "bootstrap_host", i, num_prompts)
        port = _item(self.port, "bootstrap_port", i, num_prompts)
        room = _item(self.room, "bootstrap_room", i, num_prompts)
        if host is None or room is None:
            missing = "bootstrap_room" if host is not None else "bootstrap_host"
            raise InvalidRequest(f"{missing}: required with the other bootstrap fields")
        if not isinstance(host, str) or not host:
            raise InvalidRequest(f"bootstrap_host: expected a host name, got {host!r}")
        if not is_token_id(room) or not 0 <= room < 2**63:
            raise InvalidRequest(f"bootstrap_room: expected an integer in [0, 2**63), got {room!r}")
        if port is not None and (not is_token_id(port) or not 0 < port < 65536):
            raise InvalidRequest(f"bootstrap_port: expected a port number, got {port!r}")
        if host == FAKE_BOOTSTRAP_HOST:
            return None
        return Bootstrap(host, default_port if port is None else port, room)


def _item(value: Any, name: str, i: int, num_prompts: int) -> Any:
    if not isinstance(value, list):
        return value
    if len(value) != num_prompts:
        raise InvalidRequest(f"{name}: {len(value)} entries for {num_prompts} prompts")
    return value[i]


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
    raw = _grammar_text(raw)
    try:
        params = SamplingParams.from_dict(raw)
        params.verify(vocab_size)  # before normalize, which rewrites temperature 0 → top_k 1
    except ValueError as exc:
        raise InvalidRequest(str(exc)) from None
    params.normalize()
    return params


def _grammar_text(raw: dict[str, Any]) -> dict[str, Any]:
    """`json_schema` / `structural_tag` given as a JSON object (not only as JSON text, SGLang's
    form) become the text; the grammar is keyed and compiled by its text."""
    out = dict(raw)
    for name in ("json_schema", "structural_tag"):
        if isinstance(out.get(name), dict | bool):
            out[name] = json.dumps(out[name])
    return out


def check_grammar_fields(params: SamplingParams, limits: ServerLimits) -> None:
    """A grammar field parses (else a 400 naming it), and this server can serve it."""
    if not params.has_grammar:
        return
    if limits.grammar_backend == "none":
        field = next(g for g in GRAMMAR_FIELDS if getattr(params, g) is not None)
        raise InvalidRequest(
            f"{field}: constrained decoding is off on this server (--grammar-backend none)"
        )
    try:
        check_grammar(params)
    except ValueError as exc:
        raise InvalidRequest(str(exc)) from None


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
    for index, (prompt, raw) in enumerate(zip(prompts, raw_params, strict=True)):
        params = parse_params({**limits.sampling_defaults, **raw}, limits.vocab_size)
        check_grammar_fields(params, limits)
        if params.n > MAX_N:  # each sample is a request of its own: bound the fan-out
            raise InvalidRequest(f"n: must be <= {MAX_N}, got {params.n}")
        bootstrap = None
        if options.bootstrap is not None:
            bootstrap = options.bootstrap.for_prompt(index, len(prompts), limits.bootstrap_port)
        if bootstrap is not None and params.n > 1:  # one room names one request
            raise InvalidRequest("n: must be 1 with bootstrap_room (a room per request)")
        if any(not 0 <= t < limits.vocab_size for t in prompt.input_ids):
            raise InvalidRequest(f"input_ids: token ids must be in [0, {limits.vocab_size})")
        if check_lengths:
            check_prompt(prompt.input_ids, params.max_new_tokens, limits)
        start = check_logprob_start_len(options.logprob_start_len, len(prompt.input_ids))
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
                    logprob_start_len=start if want_lp else -1,
                    data_parallel_rank=options.data_parallel_rank,
                    bootstrap=bootstrap,
                    require_reasoning=options.require_reasoning,
                )
            )
    return out


def check_logprob_start_len(start: object, prompt_len: int) -> int:
    """SGLang's `logprob_start_len`: -1 (no prompt log-probabilities) or a prompt index."""
    if not isinstance(start, int) or isinstance(start, bool) or start < -1:
        raise InvalidRequest(f"logprob_start_len: expected an integer >= -1, got {start!r}")
    if start >= max(prompt_len, 1):
        raise InvalidRequest(
            f"logprob_start_len: must be below the prompt's length ({prompt_len}), got {start}"
        )
    return start


def check_dp_rank(rank: object, dp_size: int) -> None:
    """`data_parallel_rank` (SGLang's and the router's field) is None or in [0, dp_size)."""
    if rank is None:
        return
    if not isinstance(rank, int) or isinstance(rank, bool) or not 0 <= rank < dp_size:
        raise InvalidRequest(
            f"data_parallel_rank: must be an integer in [0, {dp_size}), got {rank!r}"
        )
