"""OpenAI request models (defined in radixserve.protocol.http_api) and the pure helpers that
turn requests into engine inputs and engine chunks into OpenAI response pieces (finish reasons,
usage, logprobs).

Field checks split two ways: pydantic checks types and the few OpenAI-only bounds (n, logprobs);
sampling ranges are left to the edge's one validation step (`request_builder.build_inputs`) so
the native and OpenAI APIs report them alike, with the engine's parameter names mapped back to
the OpenAI ones (`max_new_tokens` → `max_tokens`, ...). Runs in the main process.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from fastapi import Request
from pydantic import BaseModel, ValidationError

from radixserve.engine.entrypoints.http_errors import HTTPError, read_json_object
from radixserve.engine.entrypoints.request_builder import (
    InvalidRequest,
    OutputOptions,
    Prompt,
    ServerLimits,
    build_inputs,
)
from radixserve.engine.ipc.finish_reason import FinishAbort, FinishLength, FinishReason
from radixserve.engine.ipc.messages import InputLogprobs
from radixserve.engine.tokenizer.io_struct import GenerateChunk, GenerateInput
from radixserve.protocol.http_api import (
    COMPLETION_DEFAULT_MAX_TOKENS,
    MAX_N,
    MAX_TOP_LOGPROBS,
    ChatCompletionRequest,
    ChatMessage,
    CompletionRequest,
    ContentPart,
    SamplingRequest,
    StreamOptions,
)
from radixserve.protocol.request_fields import is_token_id

__all__ = [  # the request models live in radixserve.protocol (the router publishes them too)
    "COMPLETION_DEFAULT_MAX_TOKENS",
    "MAX_N",
    "MAX_TOP_LOGPROBS",
    "ChatCompletionRequest",
    "ChatMessage",
    "CompletionRequest",
    "ContentPart",
    "SamplingRequest",
    "StreamOptions",
]

MIN_LOGPROB = -9999.0  # stands in for -inf / NaN, which JSON cannot carry

# Engine parameter name → OpenAI name, for error messages.
_RENAMES = {
    "max_new_tokens": "max_tokens",
    "min_new_tokens": "min_tokens",
    "sampling_seed": "seed",
}
_ENGINE_NAME = re.compile(r"\b(" + "|".join(_RENAMES) + r")\b")


# ---- parsing ----------------------------------------------------------------------------------


def describe_validation_error(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        loc = ".".join(str(x) for x in err.get("loc", ()))
        parts.append(f"{loc or 'body'}: {err.get('msg', 'invalid')}")
    return "; ".join(parts) or "invalid request"


async def parse_body(request: Request, model: type[BaseModel]) -> Any:
    """The request body as `model`; malformed JSON or a bad field is an InvalidRequest."""
    body = await read_json_object(request)
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        raise InvalidRequest(describe_validation_error(exc)) from None


def check_model(req: SamplingRequest, served: str) -> None:
    """A request may omit `model`; one that names it must name the served model."""
    if req.model is not None and req.model != served:
        raise InvalidRequest(f"model: The model `{req.model}` does not exist.")


def prompt_list(prompt: Any, tokenize: Callable[[str], list[int]]) -> list[Prompt]:
    """(text or None, token ids) per prompt of a completions request."""
    if isinstance(prompt, str):
        return [Prompt(prompt, tokenize(prompt))]
    if isinstance(prompt, list) and prompt:
        if all(isinstance(p, str) for p in prompt):
            return [Prompt(p, tokenize(p)) for p in prompt]
        if all(is_token_id(t) for t in prompt):
            return [Prompt(None, list(prompt))]
        if all(isinstance(p, list) and p and all(is_token_id(t) for t in p) for p in prompt):
            return [Prompt(None, list(p)) for p in prompt]
    raise InvalidRequest(
        "prompt: expected a string, a list of strings, a list of token ids "
        "or a list of non-empty lists of token ids"
    )


def rename_error(exc: InvalidRequest) -> InvalidRequest:
    """The engine's message with its parameter names replaced by the OpenAI ones."""
    return InvalidRequest(_ENGINE_NAME.sub(lambda m: _RENAMES[m.group(0)], str(exc)))


def openai_inputs(
    prompts: list[Prompt], params: dict[str, Any], limits: ServerLimits, options: OutputOptions
) -> list[GenerateInput]:
    """The edge's validation of every prompt, errors in OpenAI's parameter names."""
    try:
        return build_inputs(prompts, [params] * len(prompts), limits, options)
    except InvalidRequest as exc:
        raise rename_error(exc) from None


# ---- responses --------------------------------------------------------------------------------


def finish_reason(reason: FinishReason | None) -> tuple[str | None, int | str | None]:
    """(OpenAI finish_reason, matched stop token/string); an engine abort raises HTTPError."""
    if reason is None:
        return None, None
    if isinstance(reason, FinishAbort):
        raise HTTPError(reason.message or "request aborted", reason.status_code or 500)
    if isinstance(reason, FinishLength):
        return "length", None
    return "stop", reason.matched


def usage(lasts: list[GenerateChunk | None], n: int) -> dict[str, Any]:
    """Usage over all choices (each one's last chunk): completion tokens summed, the prompt
    counted once per prompt (its n samples share it), cached tokens the best of those samples."""
    prompt = cached = completion = 0
    for start in range(0, len(lasts), n):
        group = [c for c in lasts[start : start + n] if c is not None]
        if not group:
            continue
        prompt += group[0].prompt_tokens
        cached += max(c.cached_tokens for c in group)
        completion += sum(c.completion_tokens for c in group)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    }


def _lp(x: float) -> float:
    return x if math.isfinite(x) else MIN_LOGPROB


class TokenText:
    """Token id → its text, cached per request."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.cache: dict[int, str] = {}

    def __call__(self, tok: int) -> str:
        s = self.cache.get(tok)
        if s is None:
            s = self.cache[tok] = self.tokenizer.decode([tok])
        return s


class TokenLogprobs(NamedTuple):
    """Positions of one output (or one chunk's delta): ids with their logprobs."""

    ids: list[int]
    logprobs: Sequence[float | None]  # None: an echoed prompt's first token (no context)
    tops: list[list[tuple[float, int]]]

    @classmethod
    def echoed(cls, prompt: InputLogprobs | None, output: TokenLogprobs) -> TokenLogprobs:
        """The prompt's positions (echo), then the output's."""
        if prompt is None:
            return output
        tops = prompt.top_logprobs or [[] for _ in prompt.token_ids]
        return cls(
            prompt.token_ids + output.ids,
            [*prompt.token_logprobs, *output.logprobs],
            tops + output.tops if output.tops else tops,
        )

    def positions(self) -> list[tuple[int, float | None, list[tuple[float, int]]]]:
        tops = self.tops
        return [
            (tok, lp, tops[i] if i < len(tops) else [])
            for i, (tok, lp) in enumerate(zip(self.ids, self.logprobs, strict=False))
        ]


def completion_logprobs(
    text_of: TokenText, lps: TokenLogprobs, offset: int, with_top: bool
) -> tuple[dict[str, Any], int]:
    """Completions `logprobs` for these positions and the text offset after them."""
    out: dict[str, Any] = {
        "tokens": [],
        "token_logprobs": [],
        "top_logprobs": [],
        "text_offset": [],
    }
    for tok, lp, top in lps.positions():
        s = text_of(tok)
        out["tokens"].append(s)
        out["token_logprobs"].append(None if lp is None else _lp(lp))
        has_top = with_top and lp is not None
        out["top_logprobs"].append({text_of(t): _lp(v) for v, t in top} if has_top else None)
        out["text_offset"].append(offset)
        offset += len(s)
    return out, offset


def _chat_entry(text_of: TokenText, tok: int, lp: float) -> dict[str, Any]:
    s = text_of(tok)
    return {"token": s, "logprob": _lp(lp), "bytes": list(s.encode("utf-8"))}


def chat_logprobs(text_of: TokenText, lps: TokenLogprobs) -> dict[str, Any]:
    """Chat `logprobs` ({"content": [...]}) for these positions."""
    content = []
    for tok, lp, top in lps.positions():
        if lp is None:
            continue  # only an echoed prompt has one; chat never echoes
        entry = _chat_entry(text_of, tok, lp)
        entry["top_logprobs"] = [_chat_entry(text_of, t, v) for v, t in top]
        content.append(entry)
    return {"content": content}
