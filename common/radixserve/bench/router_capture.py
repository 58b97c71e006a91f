"""What the fake engines of `bench router-overhead` answer, captured once from a live engine.

A `Capture` holds a radixserve engine's answers to the discovery routes (`/server_info`,
`/model_info`, `/get_load`, `/v1/models`, `/get_tokenizer`) and to one chat request, plain and
streamed (the SSE events exactly as the engine framed them). It is saved as JSON so later runs
need no engine; the tokenizer's description makes it a few MB, so it lives beside the results,
not in the repository.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx

CHAT_REQUEST: dict[str, Any] = {
    "messages": [
        {"role": "system", "content": "You are a helpful assistant for the tenant acme."},
        {"role": "user", "content": "Say hello in five words."},
    ],
    "max_tokens": 16,
    "temperature": 0,
}


@dataclass(frozen=True)
class Capture:
    server_info: dict[str, Any]
    model_info: dict[str, Any]
    load: Any  # /get_load: one object, or one per DP rank
    models: dict[str, Any]
    tokenizer: str  # /get_tokenizer's body as served
    chat: str  # the chat answer's JSON
    stream: list[str]  # the streamed chat's SSE events, `data: …\n\n` each, `[DONE]` last

    @property
    def model_name(self) -> str:
        return str(self.model_info.get("served_model_name") or "model")


def _events(raw: bytes) -> list[str]:
    text = raw.decode()
    return [e + "\n\n" for e in text.split("\n\n") if e.strip()]


def capture_from(url: str, timeout: float = 300.0) -> Capture:
    """Ask a live engine at `url` for every answer a fake engine gives."""
    with httpx.Client(base_url=url, timeout=timeout) as client:

        def get(path: str) -> Any:
            resp = client.get(path)
            resp.raise_for_status()
            return resp

        chat = client.post("/v1/chat/completions", json=CHAT_REQUEST)
        chat.raise_for_status()
        stream = client.post("/v1/chat/completions", json={**CHAT_REQUEST, "stream": True})
        stream.raise_for_status()
        return Capture(
            server_info=get("/server_info").json(),
            model_info=get("/model_info").json(),
            load=get("/get_load").json(),
            models=get("/v1/models").json(),
            tokenizer=get("/get_tokenizer").text,
            chat=chat.text,
            stream=_events(stream.content),
        )


def save_capture(capture: Capture, path: str | Path) -> None:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(asdict(capture)))


def load_capture(path: str | Path) -> Capture:
    return Capture(**json.loads(Path(path).read_text()))
