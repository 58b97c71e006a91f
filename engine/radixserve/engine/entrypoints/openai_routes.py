"""OpenAI-compatible routes: /v1/models, /v1/completions and /v1/chat/completions (the latter two
implemented in openai_serving, their request models in openai_protocol)."""

from __future__ import annotations

import time
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import Response

from radixserve.engine.entrypoints.openai_serving import create_chat_completion, create_completion


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
