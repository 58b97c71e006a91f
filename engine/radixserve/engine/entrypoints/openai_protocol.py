"""OpenAI request models and the pure helpers that turn requests into engine inputs and engine
chunks into OpenAI response pieces (finish reasons, usage, logprobs).

Field checks split two ways: pydantic checks types and the few OpenAI-only bounds (n, logprobs);
sampling ranges are left to `SamplingParams.verify` (via `TokenizerManager.validate`) so the
native and OpenAI APIs report them alike, with the engine's parameter names mapped back to the
OpenAI ones (`max_new_tokens` → `max_tokens`, ...).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

from fastapi import Request
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from radixserve.engine.entrypoints.http_errors import read_json_object
from radixserve.engine.managers.tokenizer_manager import GenerateInput, RequestError

MAX_N = 128
MAX_TOP_LOGPROBS = 20
COMPLETION_DEFAULT_MAX_TOKENS = 16  # OpenAI's and SGLang's default for /v1/completions
MIN_LOGPROB = -9999.0  # stands in for -inf / NaN, which JSON cannot carry

# Engine parameter name → OpenAI name, for error messages.
_RENAMES = {
    "max_new_tokens": "max_tokens",
    "min_new_tokens": "min_tokens",
    "sampling_seed": "seed",
}
_ENGINE_NAME = re.compile(r"\b(" + "|".join(_RENAMES) + r")\b")
# Request fields passed to the engine under the same name when set.
_SAME_NAME = (
    "temperature",
    "top_p",
    "n",
    "stop",
    "frequency_penalty",
    "presence_penalty",
    "logit_bias",
    "top_k",
    "min_p",
    "repetition_penalty",
    "ignore_eos",
    "skip_special_tokens",
    "spaces_between_special_tokens",
    "no_stop_trim",
    "stop_token_ids",
)


class StreamOptions(BaseModel):
    include_usage: bool = False


class _SamplingRequest(BaseModel):
    """Fields shared by completions and chat: OpenAI's, then SGLang's extras."""

    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    n: int = Field(1, ge=1, le=MAX_N)
    stop: Any = None  # str | list[str]: checked by SamplingParams
    seed: int | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None  # accepted and ignored
    # SGLang extras
    top_k: int | None = None
    min_p: float | None = None
    min_tokens: int | None = None
    repetition_penalty: float | None = None
    ignore_eos: bool | None = None
    skip_special_tokens: bool | None = None
    spaces_between_special_tokens: bool | None = None
    no_stop_trim: bool | None = None
    stop_token_ids: list[int] | None = None

    @property
    def include_usage(self) -> bool:
        return bool(self.stream and self.stream_options and self.stream_options.include_usage)

    def sampling_params(self, max_new_tokens: int | None) -> dict[str, Any]:
        """The engine's sampling_params dict (only what was set; the engine has the defaults)."""
        params = {k: getattr(self, k) for k in _SAME_NAME if getattr(self, k) is not None}
        if max_new_tokens is not None:
            params["max_new_tokens"] = max_new_tokens
        if self.min_tokens is not None:
            params["min_new_tokens"] = self.min_tokens
        if self.seed is not None:
            params["sampling_seed"] = self.seed
        return params


class CompletionRequest(_SamplingRequest):
    prompt: Any  # str | list[str] | list[int] | list[list[int]]: see prompt_list
    max_tokens: int | None = COMPLETION_DEFAULT_MAX_TOKENS
    echo: bool = False
    logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    suffix: str | None = None


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: str
    text: str | None = None


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: str
    content: str | list[ContentPart] | None = None
    name: str | None = None


class ChatCompletionRequest(_SamplingRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    tools: list[Any] | None = None
    tool_choice: Any = None
    response_format: dict[str, Any] | None = None
    chat_template_kwargs: dict[str, Any] | None = None


# ---- parsing ----------------------------------------------------------------------------------


def describe_validation_error(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        loc = ".".join(str(x) for x in err.get("loc", ()))
        parts.append(f"{loc or 'body'}: {err.get('msg', 'invalid')}")
    return "; ".join(parts) or "invalid request"


async def parse_body(request: Request, model: type[BaseModel]) -> Any:
    """The request body as `model`; malformed JSON or a bad field is a RequestError (400)."""
    body = await read_json_object(request)
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        raise RequestError(describe_validation_error(exc)) from None


def check_model(req: _SamplingRequest, served: str) -> None:
    """A request may omit `model`; one that names it must name the served model."""
    if req.model is not None and req.model != served:
        raise RequestError(f"The model `{req.model}` does not exist.")


def _is_id(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def prompt_list(
    prompt: Any, tokenize: Callable[[str], list[int]]
) -> list[tuple[str | None, list[int]]]:
    """(text or None, token ids) per prompt of a completions request."""
    if isinstance(prompt, str):
        return [(prompt, tokenize(prompt))]
    if isinstance(prompt, list) and prompt:
        if all(isinstance(p, str) for p in prompt):
            return [(p, tokenize(p)) for p in prompt]
        if all(_is_id(t) for t in prompt):
            return [(None, list(prompt))]
        if all(isinstance(p, list) and p and all(_is_id(t) for t in p) for p in prompt):
            return [(None, list(p)) for p in prompt]
    raise RequestError(
        "prompt: expected a string, a list of strings, a list of token ids "
        "or a list of non-empty lists of token ids"
    )


def message_dicts(messages: list[ChatMessage]) -> list[dict[str, Any]]:
    """Messages for the chat template, list-of-parts content flattened to one string."""
    out = []
    for i, m in enumerate(messages):
        content = m.content
        if isinstance(content, list):
            texts = []
            for part in content:
                if part.type != "text" or part.text is None:
                    raise RequestError(
                        f"messages.{i}.content: only text parts are supported, got {part.type!r}"
                    )
                texts.append(part.text)
            content = "\n".join(texts)
        d: dict[str, Any] = {"role": m.role, "content": content or ""}
        if m.name is not None:
            d["name"] = m.name
        out.append(d)
    return out


def rename_error(exc: RequestError) -> RequestError:
    """The engine's message with its parameter names replaced by the OpenAI ones."""
    msg = _ENGINE_NAME.sub(lambda m: _RENAMES[m.group(0)], str(exc))
    return RequestError(msg, exc.status_code)


def validate_inputs(tm: Any, inputs: list[GenerateInput]) -> None:
    """Reject the whole request before anything is scheduled, in OpenAI's parameter names."""
    for inp in inputs:
        try:
            tm.validate(inp)
        except RequestError as exc:
            raise rename_error(exc) from None


# ---- responses --------------------------------------------------------------------------------


class RequestAborted(RequestError):
    """The engine finished a request with {"type": "abort"}."""


def finish_reason(meta: dict[str, Any]) -> tuple[str | None, Any]:
    """(OpenAI finish_reason, matched stop token/string) of an engine chunk; abort raises."""
    finish = meta.get("finish_reason")
    if finish is None:
        return None, None
    kind = finish.get("type")
    if kind == "abort":
        raise RequestAborted(
            str(finish.get("message") or "request aborted"), int(finish.get("status_code") or 500)
        )
    if kind == "length":
        return "length", None
    return "stop", finish.get("matched")


def usage(metas: list[dict[str, Any] | None], n: int) -> dict[str, Any]:
    """Usage over all choices: completion tokens summed, the prompt counted once per prompt
    (its n samples share it) and cached tokens as the best of those samples."""
    prompt = cached = completion = 0
    for start in range(0, len(metas), n):
        group = [m for m in metas[start : start + n] if m is not None]
        if not group:
            continue
        prompt += group[0]["prompt_tokens"]
        cached += max(m.get("cached_tokens", 0) for m in group)
        completion += sum(m["completion_tokens"] for m in group)
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


def _positions(chunk: dict[str, Any], start: int) -> list[tuple[int, float, list[Any]]]:
    """(token id, logprob, top list) for output positions start.. of the chunk.

    Indexed by the chunk's own output_ids: its logprob lists may already hold later positions.
    """
    ids, lps, tops = chunk["output_ids"], chunk["token_logprobs"], chunk["top_logprobs"]
    end = min(len(ids), len(lps))
    return [(ids[i], lps[i], tops[i] if i < len(tops) else []) for i in range(start, end)]


def completion_logprobs(
    text_of: TokenText, chunk: dict[str, Any], start: int, offset: int, with_top: bool
) -> tuple[dict[str, Any], int]:
    """Completions `logprobs` for positions start.. and the text offset after them."""
    out: dict[str, Any] = {
        "tokens": [],
        "token_logprobs": [],
        "top_logprobs": [],
        "text_offset": [],
    }
    for tok, lp, top in _positions(chunk, start):
        s = text_of(tok)
        out["tokens"].append(s)
        out["token_logprobs"].append(_lp(lp))
        out["top_logprobs"].append({text_of(t): _lp(v) for v, t in top} if with_top else None)
        out["text_offset"].append(offset)
        offset += len(s)
    return out, offset


def _chat_entry(text_of: TokenText, tok: int, lp: float) -> dict[str, Any]:
    s = text_of(tok)
    return {"token": s, "logprob": _lp(lp), "bytes": list(s.encode("utf-8"))}


def chat_logprobs(text_of: TokenText, chunk: dict[str, Any], start: int) -> dict[str, Any]:
    """Chat `logprobs` ({"content": [...]}) for positions start.."""
    content = []
    for tok, lp, top in _positions(chunk, start):
        entry = _chat_entry(text_of, tok, lp)
        entry["top_logprobs"] = [_chat_entry(text_of, t, v) for v, t in top]
        content.append(entry)
    return {"content": content}
