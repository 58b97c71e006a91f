"""/v1/completions and /v1/chat/completions: build engine inputs from an OpenAI request, run
them (prompts × n, concurrently), and answer with one JSON object or an SSE stream.

Defaults (documented behaviour): `max_tokens` is 16 for completions (OpenAI's and SGLang's
default); for chat, absent `max_tokens`/`max_completion_tokens` means "until the context is full"
(context_len − prompt − 1), as SGLang does. `n` samples of a prompt with a `seed` use seed + i.
Choice index = prompt_index · n + j. A request the engine aborts fails with the abort's message
and status (non-stream) or ends its stream with `data: {"error": ...}` then `data: [DONE]`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from radixserve.engine.entrypoints.generation import (
    collect,
    expand_n,
    merge_streams,
    until_disconnect,
)
from radixserve.engine.entrypoints.http_errors import error_response
from radixserve.engine.entrypoints.openai_protocol import (
    COMPLETION_DEFAULT_MAX_TOKENS,
    ChatCompletionRequest,
    ChatMessage,
    CompletionRequest,
    TokenText,
    chat_logprobs,
    check_model,
    completion_logprobs,
    finish_reason,
    message_dicts,
    parse_body,
    prompt_list,
    usage,
    validate_inputs,
)
from radixserve.engine.managers.tokenizer_manager import GenerateInput, RequestError

logger = logging.getLogger(__name__)

DONE = b"data: [DONE]\n\n"

Chunk = dict[str, Any]


def sse(payload: Any) -> bytes:
    return f"data: {json.dumps(payload)}\n\n".encode()


def sse_error(message: str, status_code: int) -> bytes:
    body = bytes(error_response(message, status_code).body)
    return b'data: {"error": ' + body + b"}\n\n"


@dataclass
class _Call:
    """One OpenAI call: its expanded inputs and what every response object repeats."""

    kind: str  # "text_completion" | "chat.completion"
    model: str
    inputs: list[GenerateInput]
    n: int
    text_of: TokenText
    include_usage: bool
    id: str = ""
    created: int = field(default_factory=lambda: int(time.time()))

    def __post_init__(self) -> None:
        prefix = "chatcmpl" if self.kind == "chat.completion" else "cmpl"
        self.id = f"{prefix}-{uuid.uuid4().hex}"

    @property
    def chunk_kind(self) -> str:
        return "chat.completion.chunk" if self.kind == "chat.completion" else self.kind

    def obj(self, kind: str, choices: list[Chunk], **extra: Any) -> Chunk:
        return {
            "id": self.id,
            "object": kind,
            "created": self.created,
            "model": self.model,
            "choices": choices,
            **extra,
        }


def _state(request: Request) -> Any:
    return request.app.state.server


def _build_inputs(
    prompts: list[tuple[str | None, list[int]]],
    params: dict[str, Any],
    stream: bool,
    logprobs: bool,
    top: int,
) -> list[GenerateInput]:
    base = [
        GenerateInput(ids, dict(params), text, stream, logprobs, top if logprobs else 0)
        for text, ids in prompts
    ]
    return expand_n(base)


async def _run(request: Request, call: _Call) -> list[Chunk]:
    """Non-stream: every input's final chunk (the client leaving cancels and aborts them)."""
    tm = _state(request).tokenizer_manager
    return await until_disconnect(request, lambda: collect(tm, call.inputs))


async def _events(
    request: Request,
    call: _Call,
    prologue: list[Chunk],
    on_chunk: Callable[[int, Chunk], Iterable[Chunk]],
) -> AsyncIterator[bytes]:
    """SSE body: prologue, per-chunk payloads, optional usage chunk, then [DONE].

    Closing this generator (client gone) closes merge_streams, which aborts the requests.
    """
    tm = _state(request).tokenizer_manager
    metas: list[dict[str, Any] | None] = [None] * len(call.inputs)
    try:
        for payload in prologue:
            yield sse(payload)
        async with contextlib.aclosing(merge_streams(tm, call.inputs)) as stream:
            async for i, chunk in stream:
                metas[i] = chunk["meta_info"]
                for payload in on_chunk(i, chunk):
                    yield sse(payload)
        if call.include_usage:
            yield sse(call.obj(call.chunk_kind, [], usage=usage(metas, call.n)))
    except RequestError as exc:  # an abort, or a late validation failure
        yield sse_error(str(exc), exc.status_code)
    except Exception as exc:  # noqa: BLE001 - the stream has started: report, don't raise
        logger.exception("OpenAI stream failed")
        yield sse_error(f"internal error: {exc}", 500)
    yield DONE


def _streaming(events: AsyncIterator[bytes]) -> StreamingResponse:
    return StreamingResponse(events, media_type="text/event-stream")


# ---- /v1/completions ----------------------------------------------------------------------------


async def create_completion(request: Request) -> Response:
    state = _state(request)
    req: CompletionRequest = await parse_body(request, CompletionRequest)
    check_model(req, state.args.model_name)
    if req.suffix:
        raise RequestError("suffix: not supported")
    if req.echo and req.logprobs is not None:
        raise RequestError("echo: not supported together with logprobs (no prompt logprobs)")
    tm = state.tokenizer_manager
    prompts = prompt_list(req.prompt, tm.tokenize)
    max_tokens = req.max_tokens if req.max_tokens is not None else COMPLETION_DEFAULT_MAX_TOKENS
    params = req.sampling_params(max_tokens)
    want_lp = req.logprobs is not None
    inputs = _build_inputs(prompts, params, req.stream, want_lp, req.logprobs or 0)
    validate_inputs(tm, inputs)
    call = _Call(
        "text_completion",
        state.args.model_name,
        inputs,
        req.n,
        TokenText(state.tokenizer),
        req.include_usage,
    )
    echoes = [
        (text if text is not None else state.tokenizer.decode(ids)) if req.echo else ""
        for text, ids in prompts
    ]
    with_top = bool(req.logprobs)
    if req.stream:
        return _streaming(_completion_stream(request, call, echoes, want_lp, with_top))
    outs = await _run(request, call)
    choices = []
    for i, out in enumerate(outs):
        reason, matched = finish_reason(out["meta_info"])
        lp = completion_logprobs(call.text_of, out, 0, 0, with_top)[0] if want_lp else None
        choices.append(
            {
                "index": i,
                "text": echoes[i // call.n] + out["text"],
                "logprobs": lp,
                "finish_reason": reason,
                "matched_stop": matched,
            }
        )
    body = call.obj(call.kind, choices, usage=usage([o["meta_info"] for o in outs], call.n))
    return JSONResponse(body)


def _completion_stream(
    request: Request, call: _Call, echoes: list[str], want_lp: bool, with_top: bool
) -> AsyncIterator[bytes]:
    count = len(call.inputs)
    sent, offsets, echoed = [0] * count, [0] * count, [False] * count

    def on_chunk(i: int, chunk: Chunk) -> list[Chunk]:
        reason, matched = finish_reason(chunk["meta_info"])
        text = chunk["delta"]
        if not echoed[i]:
            text, echoed[i] = echoes[i // call.n] + text, True
            offsets[i] = len(echoes[i // call.n])
        lp = None
        if want_lp:
            lp, offsets[i] = completion_logprobs(call.text_of, chunk, sent[i], offsets[i], with_top)
        sent[i] = len(chunk["output_ids"])
        if not text and reason is None and not (lp and lp["tokens"]):
            return []
        choice = {
            "index": i,
            "text": text,
            "logprobs": lp,
            "finish_reason": reason,
            "matched_stop": matched,
        }
        return [call.obj(call.kind, [choice])]

    return _events(request, call, [], on_chunk)


# ---- /v1/chat/completions -----------------------------------------------------------------------


def chat_prompt(
    state: Any,
    messages: list[ChatMessage],
    template_kwargs: dict[str, Any] | None,
    add_generation_prompt: bool = True,
) -> tuple[str, list[int]]:
    """Templated text and its ids (no second BOS when the template already starts with one).

    The one path from chat messages to prompt ids: /v1/chat/completions and /tokenize use it.
    """
    tokenizer = state.tokenizer
    if getattr(tokenizer, "chat_template", None) is None:
        raise RequestError("messages: this model has no chat template")
    try:
        text = tokenizer.apply_chat_template(
            message_dicts(messages),
            tokenize=False,
            add_generation_prompt=add_generation_prompt,
            **(template_kwargs or {}),
        )
    except RequestError:
        raise
    except Exception as exc:  # noqa: BLE001 - template errors are the client's messages
        raise RequestError(f"messages: cannot apply the chat template: {exc}") from None
    bos = getattr(tokenizer, "bos_token", None)
    if bos and text.startswith(bos):
        return text, list(tokenizer.encode(text, add_special_tokens=False))
    return text, state.tokenizer_manager.tokenize(text)


def _check_chat(req: ChatCompletionRequest) -> None:
    if req.tools:
        raise RequestError("tools: tool calling is not supported by this server")
    fmt = (req.response_format or {}).get("type")
    if fmt not in (None, "text"):
        raise RequestError('response_format: only {"type": "text"} is supported')
    if req.top_logprobs and not req.logprobs:
        raise RequestError("top_logprobs: requires logprobs to be true")


async def create_chat_completion(request: Request) -> Response:
    state = _state(request)
    req: ChatCompletionRequest = await parse_body(request, ChatCompletionRequest)
    check_model(req, state.args.model_name)
    _check_chat(req)
    tm = state.tokenizer_manager
    text, ids = chat_prompt(state, req.messages, req.chat_template_kwargs)
    max_tokens = (
        req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    )
    if max_tokens is None:  # SGLang: generate until the context is full
        max_tokens = max(0, tm.limits.context_len - len(ids) - 1)
    params = req.sampling_params(max_tokens)
    inputs = _build_inputs([(text, ids)], params, req.stream, req.logprobs, req.top_logprobs or 0)
    validate_inputs(tm, inputs)
    call = _Call(
        "chat.completion",
        state.args.model_name,
        inputs,
        req.n,
        TokenText(state.tokenizer),
        req.include_usage,
    )
    if req.stream:
        return _streaming(_chat_stream(request, call, req.logprobs))
    outs = await _run(request, call)
    choices = []
    for i, out in enumerate(outs):
        reason, matched = finish_reason(out["meta_info"])
        choices.append(
            {
                "index": i,
                "message": {"role": "assistant", "content": out["text"]},
                "logprobs": chat_logprobs(call.text_of, out, 0) if req.logprobs else None,
                "finish_reason": reason,
                "matched_stop": matched,
            }
        )
    body = call.obj(call.kind, choices, usage=usage([o["meta_info"] for o in outs], call.n))
    return JSONResponse(body)


def _chat_stream(request: Request, call: _Call, want_lp: bool) -> AsyncIterator[bytes]:
    kind = call.chunk_kind
    sent = [0] * len(call.inputs)

    def choice(i: int, delta: Chunk, lp: Any = None, reason: Any = None, **extra: Any) -> Chunk:
        c = {"index": i, "delta": delta, "logprobs": lp, "finish_reason": reason, **extra}
        return call.obj(kind, [c])

    def on_chunk(i: int, chunk: Chunk) -> list[Chunk]:
        reason, matched = finish_reason(chunk["meta_info"])
        lp = chat_logprobs(call.text_of, chunk, sent[i]) if want_lp else None
        sent[i] = len(chunk["output_ids"])
        out = []
        if chunk["delta"] or (lp and lp["content"]):
            out.append(choice(i, {"content": chunk["delta"]}, lp))
        if reason is not None:
            out.append(choice(i, {}, None, reason, matched_stop=matched))
        return out

    prologue = [choice(i, {"role": "assistant", "content": ""}) for i in range(len(call.inputs))]
    return _events(request, call, prologue, on_chunk)
