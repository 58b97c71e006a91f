"""The replica's HTTP server: native SGLang endpoints, OpenAI routes, health and metrics.

Main process: the native routes, the API-key middleware and `create_app`, which adds the error
handlers (http_errors) and the OpenAI routes (openai_serving). A route validates its body once
into `GenerateInput`s (request_builder), runs them and formats the outputs (generation /
openai_serving). All request state lives in the TokenizerManager (`app.state.server`).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator
from typing import Any

import msgspec
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from pydantic import ValidationError

from radixserve.asgi_errors import EdgeConfig
from radixserve.engine.entrypoints.generation import (
    DONE,
    GenerateOutput,
    SSEResponse,
    collect,
    native_output,
    sse,
    stream_chunks,
    until_disconnect,
)
from radixserve.engine.entrypoints.http_errors import (
    HTTPError,
    install_error_handlers,
    read_json_object,
)
from radixserve.engine.entrypoints.openai_protocol import (
    ChatCompletionRequest,
    describe_validation_error,
)
from radixserve.engine.entrypoints.openai_serving import chat_prompt, install_openai_routes
from radixserve.engine.entrypoints.request_builder import (
    BootstrapFields,
    InvalidRequest,
    OutputOptions,
    Prompt,
    build_inputs,
    native_prompts,
    per_prompt_params,
)
from radixserve.engine.entrypoints.server_state import ServerState
from radixserve.engine.ipc.finish_reason import FinishAbort
from radixserve.engine.tokenizer.io_struct import GenerateInput
from radixserve.protocol.http_api import ENGINE_BODIES, openapi_with_bodies
from radixserve.protocol.http_edge import error_response, sse_error

logger = logging.getLogger(__name__)

# Probes and Prometheus scrapes carry no key (as vLLM and SGLang leave them); /metrics holds
# counts and latencies, never request content.
OPEN_PATHS = frozenset({"/health", "/metrics"})
HEALTH_PARAMS = {"max_new_tokens": 1, "temperature": 0}


def _flag(body: dict[str, Any], name: str) -> bool:
    value = body.get(name, False)
    if not isinstance(value, bool):
        raise InvalidRequest(f"{name}: expected a boolean")
    return value


def generate_inputs(state: ServerState, body: dict[str, Any]) -> tuple[list[GenerateInput], bool]:
    """/generate's body → validated inputs (n expanded) and whether it was a single prompt."""
    tm = state.tokenizer_manager
    prompts, single = native_prompts(tm.tokenize, body.get("text"), body.get("input_ids"))
    params = per_prompt_params(body.get("sampling_params"), len(prompts))
    top = body.get("top_logprobs_num", 0)
    if not isinstance(top, int) or isinstance(top, bool):
        raise InvalidRequest("top_logprobs_num: expected an integer")
    options = OutputOptions(
        _flag(body, "stream"),
        _flag(body, "return_logprob"),
        top,
        body.get("data_parallel_rank"),  # checked by build_inputs
        BootstrapFields.of(body),  # likewise
        logprob_start_len=body.get("logprob_start_len", -1),  # likewise
    )
    inputs = build_inputs(prompts, params, state.limits, options)
    return inputs, single and len(inputs) == 1


def _tokenize_body(state: ServerState, body: dict[str, Any]) -> list[int]:
    """/tokenize: a text prompt as /generate encodes it, or (vLLM's form) chat `messages` as
    /v1/chat/completions templates and encodes them."""
    if "messages" not in body:
        prompt = body.get("prompt", body.get("text"))
        if not isinstance(prompt, str):
            raise InvalidRequest("prompt: expected a string (or pass 'messages')")
        return state.tokenizer_manager.tokenize(prompt)
    try:
        req = ChatCompletionRequest.model_validate(
            {"messages": body["messages"], "chat_template_kwargs": body.get("chat_template_kwargs")}
        )
    except ValidationError as exc:
        raise InvalidRequest(describe_validation_error(exc)) from None
    add_prompt = body.get("add_generation_prompt", True)
    if not isinstance(add_prompt, bool):
        raise InvalidRequest("add_generation_prompt: expected a boolean")
    return chat_prompt(state.tokenizer, req.messages, req.chat_template_kwargs, add_prompt)[1]


def tokenizer_info(tokenizer: Any) -> dict[str, Any]:
    """What a torch-free router needs to tokenize exactly as this engine does (see
    radixserve.router.tokenization): the fast tokenizer's own JSON (its post-processor already
    holds add_bos/add_eos), the chat template and the variables transformers passes to it."""
    return {
        "tokenizer_json": tokenizer.backend_tokenizer.to_str(),
        "chat_template": getattr(tokenizer, "chat_template", None),
        "bos_token": getattr(tokenizer, "bos_token", None),
        "eos_token": getattr(tokenizer, "eos_token", None),
        "special_tokens": dict(tokenizer.special_tokens_map),
        "split_special_tokens": bool(getattr(tokenizer, "split_special_tokens", False)),
        "add_bos_token": bool(getattr(tokenizer, "add_bos_token", False)),
        "add_eos_token": bool(getattr(tokenizer, "add_eos_token", False)),
        "tokenizer_class": type(tokenizer).__name__,
    }


def _raise_on_abort(outs: list[GenerateOutput]) -> None:
    """An engine-side abort (e.g. queue full) is the request's HTTP status."""
    for out in outs:
        reason = out.finish_reason
        if isinstance(reason, FinishAbort):
            raise HTTPError(reason.message, reason.status_code)


async def _native_events(
    state: ServerState, inputs: list[GenerateInput], return_logprob: bool
) -> AsyncGenerator[bytes, None]:
    """SSE of /generate: each chunk as SGLang sends it (cumulative text and ids so far)."""
    outs = [GenerateOutput() for _ in inputs]
    try:
        async for i, chunk in stream_chunks(state.tokenizer_manager, inputs):
            outs[i].add(chunk)
            yield sse(native_output(outs[i], return_logprob))
    except Exception:  # the stream has started: report, don't raise
        logger.exception("/generate stream failed")
        yield sse_error("internal error", 500)
    yield DONE


def install_native_routes(app: FastAPI) -> None:  # noqa: C901 - one closure per route
    def st(request: Request) -> ServerState:
        state: ServerState = request.app.state.server
        return state

    @app.get("/health")
    async def health(request: Request) -> Response:
        dead = st(request).children.dead()
        return Response(status_code=503 if dead else 200)

    @app.get("/health_generate")
    async def health_generate(request: Request) -> Response:
        state = st(request)
        inputs = build_inputs(
            [Prompt(None, [1, 2])], [HEALTH_PARAMS], state.limits, OutputOptions()
        )
        await collect(state.tokenizer_manager, inputs)
        return Response(status_code=200)

    @app.api_route("/generate", methods=["POST", "PUT"])
    async def generate(request: Request) -> Response:
        body = await read_json_object(request)
        state = st(request)
        inputs, single = generate_inputs(state, body)
        lp = inputs[0].return_logprob if inputs else False
        if inputs and inputs[0].stream:
            return SSEResponse(_native_events(state, inputs, lp))
        tm = state.tokenizer_manager
        outs = await until_disconnect(request, lambda: collect(tm, inputs))
        _raise_on_abort(outs)
        result = [native_output(o, lp) for o in outs]
        return JSONResponse(result[0] if single else result)

    @app.get("/model_info")
    async def model_info(request: Request) -> dict[str, Any]:
        return st(request).model_info

    @app.get("/server_info")
    async def server_info(request: Request) -> dict[str, Any]:
        return st(request).server_info()

    @app.get("/get_load")
    async def get_load(request: Request) -> Any:
        """One scheduler's load as an object; with --dp-size > 1 a list, one per DP rank.
        Nested parts (HiCache's, the experts', speculation's) as objects too."""
        # every field, defaults too (to_builtins of the whole struct would drop them)
        loads = [
            {f: msgspec.to_builtins(getattr(load, f)) for f in load.__struct_fields__}
            for load in await st(request).tokenizer_manager.get_load()
        ]
        return loads if len(loads) > 1 else loads[0]

    @app.api_route("/flush_cache", methods=["GET", "POST"])
    async def flush_cache(request: Request) -> Response:
        out = await st(request).tokenizer_manager.flush_cache()
        if not out.success:
            return error_response(out.message, 400)
        return JSONResponse({"success": True, "message": "Cache flushed."})

    for action in ("start", "stop", "dump"):
        app.add_api_route(
            f"/{action}_expert_distribution_record",
            _expert_distribution_route(action),
            methods=["GET", "POST"],
            name=f"{action}_expert_distribution_record",
        )

    @app.get("/debug/cache_pages")
    async def cache_pages(request: Request) -> dict[str, Any]:
        """Sorted int64 event hashes of every cached page (the scheduler's own view)."""
        outs = await st(request).tokenizer_manager.get_state(include_pages=True)
        ranks = [{"dp_rank": o.dp_rank, "page_hashes": list(o.page_hashes)} for o in outs]
        union = sorted({h for o in outs for h in o.page_hashes})
        return {"page_hashes": union, "dp_ranks": ranks}

    @app.post("/abort_request")
    async def abort_request(request: Request) -> dict[str, Any]:
        body = await read_json_object(request)
        rid = body.get("rid")
        if not isinstance(rid, str) or not rid:
            raise InvalidRequest("rid: expected a non-empty string")
        await st(request).tokenizer_manager.abort(rid)
        return {"success": True}

    @app.post("/tokenize")
    async def tokenize(request: Request) -> dict[str, Any]:
        body = await read_json_object(request)
        state = st(request)
        ids = _tokenize_body(state, body)
        return {
            "tokens": ids,
            "count": len(ids),
            "max_model_len": state.model_info["context_length"],
        }

    @app.get("/get_tokenizer")
    async def get_tokenizer(request: Request) -> dict[str, Any]:
        return tokenizer_info(st(request).tokenizer)

    @app.post("/detokenize")
    async def detokenize(request: Request) -> dict[str, Any]:
        body = await read_json_object(request)
        tokens = body.get("tokens")
        if not isinstance(tokens, list) or not all(
            isinstance(t, int) and not isinstance(t, bool) for t in tokens
        ):
            raise InvalidRequest("tokens: expected a list of token ids")
        tokenizer = st(request).tokenizer
        vocab = len(tokenizer)
        if bad := [t for t in tokens if not 0 <= t < vocab]:
            raise InvalidRequest(f"tokens: ids must be in [0, {vocab}), got {bad[:4]}")
        return {"text": tokenizer.decode(tokens)}

    @app.get("/metrics")
    async def metrics(request: Request) -> Response:
        state = st(request)
        loads = await state.tokenizer_manager.get_load()
        return Response(state.metrics.render(loads), media_type="text/plain; version=0.0.4")


def create_app(state: ServerState) -> FastAPI:
    app = FastAPI(title="radixserve engine")
    app.state.server = state
    args = state.args
    edge = EdgeConfig(args.max_request_body_bytes, args.api_key, OPEN_PATHS.__contains__)
    install_error_handlers(app, edge)
    install_native_routes(app)
    install_openai_routes(app)
    app.openapi = openapi_with_bodies(app.openapi, ENGINE_BODIES)  # type: ignore[method-assign]
    return app


def _expert_distribution_route(action: str) -> Any:
    """SGLang's /{start,stop,dump}_expert_distribution_record: 400 naming the flag when the
    recorder is off; a dump answers the counts [passes][layers][experts], the physical slots'
    counts and placement (EPLB), and the file."""

    async def route(request: Request) -> Response:
        state: ServerState = request.app.state.server
        out = await state.tokenizer_manager.expert_distribution(action)
        if not out.success:
            return error_response(out.message, 400)
        body: dict[str, Any] = {"success": True}
        if action == "dump":
            body.update(
                path=out.message,
                logical_count=out.counts,
                physical_count=out.physical_counts,
                physical_to_logical_map=out.physical_to_logical_map,
            )
        return JSONResponse(body)

    return route
