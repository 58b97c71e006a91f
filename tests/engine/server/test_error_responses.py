"""Only validation errors are client errors: a field the edge rejects is a 400 naming it; any
other exception is a 500 carrying the request id, with its traceback logged under that id."""

from __future__ import annotations

import logging

import httpx
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from tests.engine.server.live_server import LiveServer


def test_live_validation_error_is_a_400_naming_the_field(server: LiveServer) -> None:
    body = {"text": "hi", "sampling_params": {"temperature": -1}}
    r = httpx.post(server.base_url + "/generate", json=body, timeout=30)
    assert r.status_code == 400
    err = r.json()
    assert err["param"] == "temperature" and err["message"].startswith("temperature:")
    r = httpx.post(server.base_url + "/generate", json={"text": "hi", "stream": "yes"}, timeout=30)
    assert r.status_code == 400 and r.json()["param"] == "stream"


def test_live_out_of_range_token_ids_are_a_400_naming_the_field(server: LiveServer) -> None:
    # Once handed to the tokenizer unchecked: a negative id overflowed inside it (a 500).
    for tokens in ([-1], [0, 10**9], [True]):
        r = httpx.post(server.base_url + "/detokenize", json={"tokens": tokens}, timeout=30)
        assert r.status_code == 400, (tokens, r.text)
        assert r.json()["param"] == "tokens"
    r = httpx.post(server.base_url + "/detokenize", json={"tokens": [1, 2]}, timeout=30)
    assert r.status_code == 200 and isinstance(r.json()["text"], str)


def _app() -> FastAPI:
    from radixserve.engine.entrypoints.http_errors import install_error_handlers
    from radixserve.engine.entrypoints.request_builder import InvalidRequest

    app = FastAPI()
    install_error_handlers(app)

    @app.get("/invalid")
    async def invalid() -> None:
        raise InvalidRequest("top_p: must be in (0, 1], got 0")

    @app.get("/bug")
    async def bug() -> None:
        raise ValueError("an internal invariant broke")  # a ValueError is not a client error

    return app


def test_value_error_is_a_500_and_invalid_request_a_400(caplog: pytest.LogCaptureFixture) -> None:
    client = TestClient(_app(), raise_server_exceptions=False)
    r = client.get("/invalid")
    assert r.status_code == 400 and r.json()["param"] == "top_p"
    with caplog.at_level(logging.ERROR):
        r = client.get("/bug", headers={"X-Request-ID": "req-123"})
    assert r.status_code == 500
    assert r.json()["request_id"] == "req-123" and r.json()["object"] == "error"
    assert "an internal invariant broke" not in r.json()["message"]  # details stay in the log
    logged = [rec for rec in caplog.records if "req-123" in rec.getMessage()]
    assert logged and logged[0].exc_info is not None
