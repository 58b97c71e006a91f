"""The replica's HTTP server: native SGLang endpoints, OpenAI routes, health and metrics.

Routes only: all request state lives in the TokenizerManager on `app.state.server`.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import ValidationError

from radixserve.engine.entrypoints.generation import (
    collect,
    expand_n,
    merge_streams,
    until_disconnect,
)
from radixserve.engine.entrypoints.http_errors import (
    error_response,
    install_error_handlers,
    read_json_object,
)
from radixserve.engine.entrypoints.openai_protocol import (
    ChatCompletionRequest,
    describe_validation_error,
)
from radixserve.engine.entrypoints.openai_routes import install_openai_routes
from radixserve.engine.entrypoints.openai_serving import chat_prompt
from radixserve.engine.entrypoints.server_state import ServerState
from radixserve.engine.managers.tokenizer_manager import GenerateInput, RequestError

OPEN_PATHS = {"/health"}


def sse(payload: Any) -> bytes:
    return f"data: {json.dumps(payload)}\n\n".encode()


def _body_inputs(state: ServerState, body: dict[str, Any]) -> tuple[list[GenerateInput], bool]:
    text, ids = body.get("text"), body.get("input_ids")
    if (text is None) == (ids is None):
        raise RequestError("text: pass exactly one of 'text' or 'input_ids'")
    single = isinstance(text, str) or (isinstance(ids, list) and ids and isinstance(ids[0], int))
    tm = state.tokenizer_manager
    if text is not None:
        texts = [text] if isinstance(text, str) else text
        if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
            raise RequestError("text: expected a string or a list of strings")
        prompts = [(t, tm.tokenize(t)) for t in texts]
    else:
        lists = [ids] if single else ids
        if not isinstance(lists, list) or not all(isinstance(x, list) for x in lists):
            raise RequestError("input_ids: expected a list of ints or a list of lists")
        if not all(isinstance(t, int) for x in lists for t in x):
            raise RequestError("input_ids: token ids must be integers")
        prompts = [(None, list(x)) for x in lists]
    params = body.get("sampling_params") or {}
    if isinstance(params, list) and len(params) != len(prompts):
        raise RequestError(f"sampling_params: {len(params)} entries for {len(prompts)} prompts")
    per = params if isinstance(params, list) else [params] * len(prompts)
    top = int(body.get("top_logprobs_num") or 0)
    inputs = [
        GenerateInput(
            p_ids,
            dict(sp),
            text=p_text,
            stream=bool(body.get("stream")),
            return_logprob=bool(body.get("return_logprob")) or top > 0,
            top_logprobs_num=top,
        )
        for (p_text, p_ids), sp in zip(prompts, per, strict=True)
    ]
    return expand_n(inputs), bool(single) and len(inputs) == 1


def _tokenize_body(state: ServerState, body: dict[str, Any]) -> list[int]:
    """/tokenize: a text prompt as /generate encodes it, or (vLLM's form) chat `messages` as
    /v1/chat/completions templates and encodes them."""
    if "messages" not in body:
        prompt = body.get("prompt", body.get("text"))
        if not isinstance(prompt, str):
            raise RequestError("prompt: expected a string (or pass 'messages')")
        return state.tokenizer_manager.tokenize(prompt)
    try:
        req = ChatCompletionRequest.model_validate(
            {"messages": body["messages"], "chat_template_kwargs": body.get("chat_template_kwargs")}
        )
    except ValidationError as exc:
        raise RequestError(describe_validation_error(exc)) from None
    add_prompt = body.get("add_generation_prompt", True)
    if not isinstance(add_prompt, bool):
        raise RequestError("add_generation_prompt: expected a boolean")
    return chat_prompt(state, req.messages, req.chat_template_kwargs, add_prompt)[1]


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


def native_output(chunk: dict[str, Any], return_logprob: bool) -> dict[str, Any]:
    meta = dict(chunk["meta_info"])
    if return_logprob:
        ids = chunk["output_ids"]
        meta["output_token_logprobs"] = [
            [lp, t, None] for lp, t in zip(chunk["token_logprobs"], ids, strict=False)
        ]
        if chunk["top_logprobs"]:
            meta["output_top_logprobs"] = [
                [[lp, t, None] for lp, t in row] for row in chunk["top_logprobs"]
            ]
    return {"text": chunk["text"], "output_ids": chunk["output_ids"], "meta_info": meta}


def install_native_routes(app: FastAPI) -> None:  # noqa: C901 - one closure per route
    def st(request: Request) -> ServerState:
        return request.app.state.server

    @app.get("/health")
    async def health(request: Request) -> Response:
        dead = st(request).children.dead()
        return Response(status_code=503 if dead else 200)

    @app.get("/health_generate")
    async def health_generate(request: Request) -> Response:
        tm = st(request).tokenizer_manager
        inp = GenerateInput([1, 2], {"max_new_tokens": 1, "temperature": 0})
        await collect(tm, [inp])
        return Response(status_code=200)

    @app.api_route("/generate", methods=["POST", "PUT"])
    async def generate(request: Request) -> Response:
        body = await read_json_object(request)
        state = st(request)
        inputs, single = _body_inputs(state, body)
        tm, lp = state.tokenizer_manager, bool(body.get("return_logprob"))
        if body.get("stream"):

            async def events() -> AsyncIterator[bytes]:
                async for _, chunk in merge_streams(tm, inputs):
                    yield sse(native_output(chunk, lp))
                yield b"data: [DONE]\n\n"

            for inp in inputs:
                tm.validate(inp)
            return StreamingResponse(events(), media_type="text/event-stream")
        outs = await until_disconnect(request, lambda: collect(tm, inputs))
        for o in outs:  # an engine-side abort (e.g. queue full) is the request's HTTP status
            reason = o["meta_info"]["finish_reason"] or {}
            if reason.get("type") == "abort":
                return error_response(
                    reason.get("message", "aborted"), int(reason.get("status_code", 400))
                )
        result = [native_output(o, lp) for o in outs]
        return JSONResponse(result[0] if single else result)

    @app.get("/model_info")
    async def model_info(request: Request) -> dict[str, Any]:
        return st(request).model_info

    @app.get("/server_info")
    async def server_info(request: Request) -> dict[str, Any]:
        return st(request).server_info()

    @app.get("/get_load")
    async def get_load(request: Request) -> dict[str, Any]:
        load = await st(request).tokenizer_manager.get_load()
        return {f: getattr(load, f) for f in load.__struct_fields__}

    @app.api_route("/flush_cache", methods=["GET", "POST"])
    async def flush_cache(request: Request) -> Response:
        out = await st(request).tokenizer_manager.flush_cache()
        if not out.success:
            return error_response(out.message, 400)
        return JSONResponse({"success": True, "message": "Cache flushed."})

    @app.get("/debug/cache_pages")
    async def cache_pages(request: Request) -> dict[str, Any]:
        """Sorted int64 event hashes of every cached page (the scheduler's own view)."""
        out = await st(request).tokenizer_manager.get_state(include_pages=True)
        return {"page_hashes": list(out.page_hashes)}

    @app.post("/abort_request")
    async def abort_request(request: Request) -> dict[str, Any]:
        body = await read_json_object(request)
        rid = body.get("rid")
        if not isinstance(rid, str) or not rid:
            raise RequestError("rid: expected a non-empty string")
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
        if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
            raise RequestError("tokens: expected a list of token ids")
        return {"text": st(request).tokenizer.decode(tokens)}

    @app.get("/metrics")
    async def metrics(request: Request) -> Response:
        state = st(request)
        load = await state.tokenizer_manager.get_load()
        return Response(state.metrics.render(load), media_type="text/plain; version=0.0.4")


def install_api_key(app: FastAPI, api_key: str | None) -> None:
    if not api_key:
        return

    @app.middleware("http")
    async def check_key(request: Request, call_next: Any) -> Response:
        authorized = request.headers.get("authorization") == f"Bearer {api_key}"
        if request.url.path not in OPEN_PATHS and not authorized:
            return error_response("invalid or missing API key", 401)
        return await call_next(request)


def create_app(state: ServerState) -> FastAPI:
    app = FastAPI(title="radixserve engine")
    app.state.server = state
    install_error_handlers(app)
    install_api_key(app, state.args.api_key)
    install_native_routes(app)
    install_openai_routes(app)
    return app
