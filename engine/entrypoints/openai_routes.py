"""OpenAI-compatible routes: /v1/models (completions and chat are added by openai_serving)."""

from __future__ import annotations

import time
from typing import Any

from fastapi import FastAPI, Request


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
