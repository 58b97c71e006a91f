"""The OpenAI routes (/v1/models, /v1/completions, /v1/chat/completions): validate an OpenAI
request into engine inputs, run them (prompts × n, concurrently), and answer with one JSON
object or an SSE stream. Runs in the main process.

Defaults (documented behaviour): `max_tokens` is 16 for completions (OpenAI's and SGLang's
default); for chat, absent `max_tokens`/`max_completion_tokens` means "until the context is full"
(context_len − prompt − 1), as SGLang does. `n` samples of a prompt with a `seed` use seed + i.
Choice index = prompt_index · n + j. A request the engine aborts fails with the abort's message
and status (non-stream) or ends its stream with `data: {"error": ...}` then `data: [DONE]`.
A client that disconnects aborts its requests (see generation.py).
"""

from __future__ import annotations

import contextlib
import logging
import time
import uuid
from collections.abc import AsyncGenerator, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from radixserve.engine.entrypoints.chat_output import ChatOutputConfig, ChoiceOutput
from radixserve.engine.entrypoints.function_call import (
    plan_tools,
    tool_finish,
    with_tool_constraint,
)
from radixserve.engine.entrypoints.generation import (
    DONE,
    GenerateOutput,
    SSEResponse,
    collect,
    sse,
    stream_chunks,
    until_disconnect,
)
from radixserve.engine.entrypoints.http_errors import HTTPError
from radixserve.engine.entrypoints.openai_protocol import (
    COMPLETION_DEFAULT_MAX_TOKENS,
    ChatCompletionRequest,
    ChatMessage,
    CompletionRequest,
    SamplingRequest,
    TokenLogprobs,
    TokenText,
    chat_logprobs,
    check_model,
    completion_logprobs,
    finish_reason,
    openai_inputs,
    parse_body,
    prompt_list,
    usage,
)
from radixserve.engine.entrypoints.reasoning import starts_in_reasoning, thinks_first
from radixserve.engine.entrypoints.request_builder import (
    BootstrapFields,
    InvalidRequest,
    OutputOptions,
    Prompt,
)
from radixserve.engine.entrypoints.response_format import response_format_params
from radixserve.engine.entrypoints.server_state import ServerState
from radixserve.engine.tokenizer.io_struct import GenerateChunk, GenerateInput
from radixserve.protocol.http_edge import sse_error
from radixserve.protocol.request_fields import message_dicts

logger = logging.getLogger(__name__)

Chunk = dict[str, Any]


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


def _state(request: Request) -> ServerState:
    state: ServerState = request.app.state.server
    return state


def _lps(x: GenerateOutput | GenerateChunk) -> TokenLogprobs:
    return TokenLogprobs(x.output_ids, x.token_logprobs, x.top_logprobs)


async def _run(request: Request, call: _Call) -> list[GenerateOutput]:
    """Non-stream: every input's output (the client leaving cancels and aborts them)."""
    tm = _state(request).tokenizer_manager
    return await until_disconnect(request, lambda: collect(tm, call.inputs))


async def _events(
    request: Request,
    call: _Call,
    prologue: list[Chunk],
    on_chunk: Callable[[int, GenerateChunk], Iterable[Chunk]],
) -> AsyncGenerator[bytes, None]:
    """SSE body: prologue, per-chunk payloads, optional usage chunk, then [DONE].

    Closing this generator (client gone) closes stream_chunks, which aborts the requests.
    """
    tm = _state(request).tokenizer_manager
    lasts: list[GenerateChunk | None] = [None] * len(call.inputs)
    try:
        for payload in prologue:
            yield sse(payload)
        async with contextlib.aclosing(stream_chunks(tm, call.inputs)) as stream:
            async for i, chunk in stream:
                lasts[i] = chunk
                for payload in on_chunk(i, chunk):
                    yield sse(payload)
        if call.include_usage:
            yield sse(call.obj(call.chunk_kind, [], usage=usage(lasts, call.n)))
    except HTTPError as exc:  # an engine abort
        yield sse_error(str(exc), exc.status_code)
    except Exception:  # the stream has started: report, don't raise
        logger.exception("OpenAI stream failed")
        yield sse_error("internal error", 500)
    yield DONE


def _streaming(events: AsyncGenerator[bytes, None]) -> StreamingResponse:
    return SSEResponse(events)


# ---- /v1/completions ----------------------------------------------------------------------------


def _bootstrap(req: SamplingRequest) -> BootstrapFields | None:
    return BootstrapFields.of(
        {
            "bootstrap_host": req.bootstrap_host,
            "bootstrap_port": req.bootstrap_port,
            "bootstrap_room": req.bootstrap_room,
        }
    )


async def create_completion(request: Request) -> Response:
    state = _state(request)
    req: CompletionRequest = await parse_body(request, CompletionRequest)
    check_model(req, state.args.model_name)
    if req.suffix:
        raise InvalidRequest("suffix: not supported")
    prompts = prompt_list(req.prompt, state.tokenizer_manager.tokenize)
    max_tokens = req.max_tokens if req.max_tokens is not None else COMPLETION_DEFAULT_MAX_TOKENS
    want_lp = req.logprobs is not None
    options = OutputOptions(
        req.stream,
        want_lp,
        req.logprobs or 0,
        req.data_parallel_rank,
        _bootstrap(req),
        logprob_start_len=0 if req.echo else -1,  # echo: the prompt's logprobs come first
    )
    params = {**req.sampling_params(max_tokens), **response_format_params(req.response_format)}
    inputs = openai_inputs(prompts, params, state.limits, options)
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
        reason, matched = finish_reason(out.finish_reason)
        lps = TokenLogprobs.echoed(out.input_logprobs, _lps(out))
        lp = completion_logprobs(call.text_of, lps, 0, with_top)[0] if want_lp else None
        choices.append(
            {
                "index": i,
                "text": echoes[i // call.n] + out.text,
                "logprobs": lp,
                "finish_reason": reason,
                "matched_stop": matched,
            }
        )
    body = call.obj(call.kind, choices, usage=usage([o.last for o in outs], call.n))
    return JSONResponse(body)


def _completion_stream(
    request: Request, call: _Call, echoes: list[str], want_lp: bool, with_top: bool
) -> AsyncGenerator[bytes, None]:
    count = len(call.inputs)
    offsets, echoed = [0] * count, [False] * count

    def on_chunk(i: int, chunk: GenerateChunk) -> list[Chunk]:
        reason, matched = finish_reason(chunk.finish_reason)
        text = chunk.text_delta
        if not echoed[i]:
            text, echoed[i] = echoes[i // call.n] + text, True
            # the prompt's own logprobs (echo) start at its first character
            offsets[i] = 0 if chunk.input_logprobs is not None else len(echoes[i // call.n])
        lp = None
        if want_lp:
            lps = TokenLogprobs.echoed(chunk.input_logprobs, _lps(chunk))
            lp, offsets[i] = completion_logprobs(call.text_of, lps, offsets[i], with_top)
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
    tokenizer: Any,
    messages: list[ChatMessage],
    template_kwargs: dict[str, Any] | None,
    add_generation_prompt: bool = True,
    tools: list[dict[str, Any]] | None = None,
) -> tuple[str, list[int]]:
    """Templated text and its ids (no second BOS when the template already starts with one).

    The one path from chat messages to prompt ids: /v1/chat/completions and /tokenize use it.
    `tools` (OpenAI's shape) go to the template, which may show them to the model or not.
    """
    if getattr(tokenizer, "chat_template", None) is None:
        raise InvalidRequest("messages: this model has no chat template")
    try:
        dicts = message_dicts([m.model_dump() for m in messages])
    except ValueError as exc:  # a non-text part: the field is in the message
        raise InvalidRequest(str(exc)) from None
    try:
        text = tokenizer.apply_chat_template(
            dicts,
            tokenize=False,
            add_generation_prompt=add_generation_prompt,
            **{**(template_kwargs or {}), **({"tools": tools} if tools else {})},
        )
    except Exception as exc:  # template errors are the client's messages
        raise InvalidRequest(f"messages: cannot apply the chat template: {exc}") from None
    bos = getattr(tokenizer, "bos_token", None)
    with_special = not (bos and text.startswith(bos))
    return text, list(tokenizer.encode(text, add_special_tokens=with_special))


def _check_chat(req: ChatCompletionRequest) -> None:
    if req.top_logprobs and not req.logprobs:
        raise InvalidRequest("top_logprobs: requires logprobs to be true")


async def create_chat_completion(request: Request) -> Response:
    state = _state(request)
    req: ChatCompletionRequest = await parse_body(request, ChatCompletionRequest)
    check_model(req, state.args.model_name)
    _check_chat(req)
    args = state.args
    plan = plan_tools(req.tools, req.tool_choice, req.parallel_tool_calls, args.tool_call_parser)
    text, ids = chat_prompt(
        state.tokenizer, req.messages, req.chat_template_kwargs, tools=plan.template_tools
    )
    max_tokens = (
        req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    )
    if max_tokens is None:  # SGLang: generate until the context is full
        max_tokens = max(0, state.limits.context_len - len(ids) - 1)
    top = (req.top_logprobs or 0) if req.logprobs else 0
    parser, kwargs = args.reasoning_parser, req.chat_template_kwargs
    thinks = (
        parser is not None
        and req.separate_reasoning
        and thinks_first(parser, kwargs, state.thinks_by_default)
    )
    options = OutputOptions(
        req.stream, req.logprobs, top, req.data_parallel_rank, _bootstrap(req), thinks
    )
    params = {**req.sampling_params(max_tokens), **response_format_params(req.response_format)}
    params = with_tool_constraint(params, plan)
    inputs = openai_inputs([Prompt(text, ids)], params, state.limits, options)
    reasoning = None
    if parser is not None and req.separate_reasoning:
        reasoning = starts_in_reasoning(parser)
    output = ChatOutputConfig(plan, reasoning)
    call = _Call(
        "chat.completion",
        state.args.model_name,
        inputs,
        req.n,
        TokenText(state.tokenizer),
        req.include_usage,
    )
    if req.stream:
        return _streaming(_chat_stream(request, call, req.logprobs, output))
    outs = await _run(request, call)
    choices = []
    for i, out in enumerate(outs):
        reason, matched = finish_reason(out.finish_reason)
        parsed = ChoiceOutput(output)
        message = parsed.message(out.text)
        choices.append(
            {
                "index": i,
                "message": message,
                "logprobs": chat_logprobs(call.text_of, _lps(out)) if req.logprobs else None,
                "finish_reason": tool_finish(reason, parsed.has_tool_calls),
                "matched_stop": matched,
            }
        )
    body = call.obj(call.kind, choices, usage=usage([o.last for o in outs], call.n))
    return JSONResponse(body)


def _chat_stream(
    request: Request, call: _Call, want_lp: bool, output: ChatOutputConfig
) -> AsyncGenerator[bytes, None]:
    kind = call.chunk_kind
    parsers = [ChoiceOutput(output) for _ in call.inputs]

    def choice(i: int, delta: Chunk, lp: Any = None, reason: Any = None, **extra: Any) -> Chunk:
        c = {"index": i, "delta": delta, "logprobs": lp, "finish_reason": reason, **extra}
        return call.obj(kind, [c])

    def on_chunk(i: int, chunk: GenerateChunk) -> list[Chunk]:
        reason, matched = finish_reason(chunk.finish_reason)
        lp = chat_logprobs(call.text_of, _lps(chunk)) if want_lp else None
        out = []
        if output.is_plain:
            if chunk.text_delta or (lp and lp["content"]):
                out.append(choice(i, {"content": chunk.text_delta}, lp))
        else:
            deltas = parsers[i].deltas(chunk.text_delta, final=reason is not None)
            if not deltas and lp and lp["content"]:
                deltas = [{"content": ""}]
            out += [choice(i, d, lp if k == 0 else None) for k, d in enumerate(deltas)]
        if reason is not None:
            reason = tool_finish(reason, parsers[i].has_tool_calls)
            out.append(choice(i, {}, None, reason, matched_stop=matched))
        return out

    prologue = [choice(i, {"role": "assistant", "content": ""}) for i in range(len(call.inputs))]
    return _events(request, call, prologue, on_chunk)


# ---- routes -----------------------------------------------------------------------------------


def install_openai_routes(app: FastAPI) -> None:
    @app.get("/v1/models")
    async def models(request: Request) -> dict[str, Any]:
        name = request.app.state.server.args.model_name
        return {
            "object": "list",
            "data": [
                {
                    "id": name,
                    "object": "model",
                    "created": int(time.time()),
                    "owned_by": "radixserve",
                    "root": name,
                    "max_model_len": request.app.state.server.model_info["context_length"],
                }
            ],
        }

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await create_completion(request)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await create_chat_completion(request)
