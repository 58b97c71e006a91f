"""Bad input: schemathesis against the engine's and the router's own OpenAPI documents.

Every generated body (conforming to the published schema, or violating it) gets an answer, no
5xx, and every 4xx is the error object naming its field; the same body with a NaN or Infinity
in it is a 400 naming where; a well-formed request running beside the fuzzer is never harmed;
the server is healthy afterwards. The oracle is the schema itself (schemathesis derives the
cases from what /openapi.json says) and the HTTP status contract.
"""

from __future__ import annotations

import socket

import httpx
import pytest

from tests.engine.server.live_server import LiveServer
from tests.reliability.api_fuzz import (
    FuzzReport,
    cases_per_route,
    fuzz,
    send_case,
    steady_traffic,
    with_non_finite,
)
from tests.router.router_proc import Router

ENGINE_PATHS = [
    "/generate",
    "/v1/completions",
    "/v1/chat/completions",
    "/tokenize",
    "/detokenize",
    "/abort_request",
]
ROUTER_PATHS = ["/generate", "/v1/completions", "/v1/chat/completions"]
WELL_FORMED = {
    "input_ids": [5, 6, 7, 8],
    "sampling_params": {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True},
}


def _well_formed(base_url: str) -> httpx.Response:
    return httpx.post(base_url + "/generate", json=WELL_FORMED, timeout=300)


def _check_healthy(base_url: str) -> None:
    assert httpx.get(base_url + "/health", timeout=30).status_code == 200
    resp = _well_formed(base_url)
    assert resp.status_code == 200, resp.text
    assert len(resp.json()["output_ids"]) == 8


def _fuzz_and_check(base_url: str, paths: list[str]) -> None:
    def send(client: httpx.Client) -> httpx.Response:
        return client.post(base_url + "/generate", json=WELL_FORMED)

    with steady_traffic(send) as beside:
        report = fuzz(base_url, paths, cases_per_route())
    print(f"fuzz {base_url}: {report.total} cases {dict(report.cases)} {dict(report.statuses)}")
    assert not report.failures, "\n".join(report.failures[:20])
    assert not beside, beside[:5]
    assert report.total >= len(paths) * 2 * min(cases_per_route(), 10)
    _check_healthy(base_url)


def test_openapi_describes_the_bodies(tiny_server: LiveServer, tiny_router: Router) -> None:
    for url, paths in ((tiny_server.base_url, ENGINE_PATHS), (tiny_router.url, ROUTER_PATHS)):
        doc = httpx.get(url + "/openapi.json", timeout=30).json()
        for path in paths:
            body = doc["paths"][path]["post"]["requestBody"]["content"]["application/json"]
            name = body["schema"]["$ref"].rsplit("/", 1)[1]
            assert doc["components"]["schemas"][name]["properties"], (url, path)


def test_engine_survives_fuzzing(tiny_server: LiveServer) -> None:
    _fuzz_and_check(tiny_server.base_url, ENGINE_PATHS)


def test_router_survives_fuzzing(tiny_server: LiveServer, tiny_router: Router) -> None:
    _fuzz_and_check(tiny_router.url, ROUTER_PATHS)


# ---- limits: each bound is a 400 naming its field (the same tiny server) ----------------------

MAX_NEW, TOP = "max_new_tokens", "top_logprobs"
USER = [{"role": "user", "content": "t5"}]
LIMIT_CASES = [
    ("/generate", {"input_ids": [5] * 300}, "input_ids"),  # beyond the 256-token context
    ("/generate", {"input_ids": [5], "sampling_params": {"max_new_tokens": 10**6}}, MAX_NEW),
    ("/generate", {"input_ids": [5], "sampling_params": {"n": 129}}, "n"),
    ("/generate", {"input_ids": [5], "top_logprobs_num": 10**6}, "top_logprobs_num"),
    ("/v1/completions", {"prompt": [5] * 300}, "input_ids"),
    ("/v1/completions", {"prompt": [5], "max_tokens": 10**6}, "max_tokens"),
    ("/v1/completions", {"prompt": [5], "n": 129}, "n"),
    ("/v1/completions", {"prompt": [5], "logprobs": 21}, "logprobs"),
    ("/v1/chat/completions", {"messages": USER, "top_logprobs": 21, "logprobs": True}, TOP),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "t5 " * 300}]}, "input_ids"),
]  # fmt: skip


def test_limits_are_400s_naming_the_field(tiny_server: LiveServer, tiny_router: Router) -> None:
    for base in (tiny_server.base_url, tiny_router.url):
        for path, body, field in LIMIT_CASES:
            resp = httpx.post(base + path, json=body, timeout=60)
            assert resp.status_code == 400, (base, path, body, resp.text)
            message = resp.json()["message"]
            assert message.split(":", 1)[0].split(".")[0] == field, (path, message)


# ---- a grammar the vocabulary cannot spell: a 400 naming its field (the same tiny server) -------

# The tiny tokenizer's words are t0..t255, so no token starts "x": the grammar allows nothing.
UNSPELLABLE = [
    ("/generate", {"text": "t5", "sampling_params": {"regex": "x+", "max_new_tokens": 4}}, "regex"),
    ("/v1/completions", {"prompt": "t5", "max_tokens": 4, "regex": "x"}, "regex"),
    ("/v1/chat/completions", {"messages": USER, "max_tokens": 4, "response_format": {
        "type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}}},
     "json_schema"),  # the scheduler knows the grammar by its field in response_format
]  # fmt: skip


@pytest.mark.parametrize("server", ["engine", "router"])
def test_a_grammar_no_token_can_follow_is_a_400_naming_the_field(
    tiny_server: LiveServer, tiny_router: Router, server: str
) -> None:
    base = tiny_server.base_url if server == "engine" else tiny_router.url
    for path, body, field in UNSPELLABLE:
        resp = httpx.post(base + path, json=body, timeout=60)
        assert resp.status_code == 400, (path, body, resp.text)
        assert resp.json()["message"].startswith(field), resp.text
        assert "no token of the model's vocabulary" in resp.json()["message"], resp.text
    _check_healthy(base)


# ---- non-finite numbers: a 400 naming the field (the same tiny server) --------------------------

CHAT_NAN = b'{"messages": [{"role": "user", "content": NaN}]}'
TOP_P_NAN = b'{"input_ids": [5], "sampling_params": {"top_p": NaN}}'
NON_FINITE_CASES = [
    ("/generate", TOP_P_NAN, "sampling_params.top_p"),
    ("/generate", b'{"input_ids": [5, Infinity]}', "input_ids[1]"),
    ("/v1/completions", b'{"prompt": [5], "temperature": -Infinity}', "temperature"),
    ("/v1/completions", b'{"prompt": [5], "logit_bias": {"5": 1e999}}', "logit_bias.5"),
    ("/v1/chat/completions", CHAT_NAN, "messages[0].content"),
    ("/v1/chat/completions", b'{"messages": [], "top_p": Infinity}', "top_p"),
]  # fmt: skip


@pytest.mark.parametrize("server", ["engine", "router"])
def test_non_finite_numbers_are_400s_naming_the_field(
    tiny_server: LiveServer, tiny_router: Router, server: str
) -> None:
    base = tiny_server.base_url if server == "engine" else tiny_router.url
    for path, raw, field in NON_FINITE_CASES:
        resp = httpx.post(base + path, content=raw, headers={"content-type": "application/json"})
        assert resp.status_code == 400, (path, raw, resp.text)
        body = resp.json()
        assert body["object"] == "error" and body["code"] == 400, body
        assert body["message"].startswith(f"{field}: expected a finite number"), (raw, body)
    _check_healthy(base)


def test_the_fuzz_corpus_writes_the_literal_where_it_says() -> None:
    chat = {"messages": [{"role": "user", "content": "hi"}], "n": 2, "stop": None}
    raw, path = with_non_finite(chat, "-Infinity")
    assert (raw, path) == (
        b'{"messages": [{"role": "user", "content": "hi"}], "n": -Infinity, "stop": null}',
        "n",
    )
    raw, path = with_non_finite({"sampling_params": {"stop": ["x"], "top_k": [3]}}, "NaN")
    assert (raw, path) == (
        b'{"sampling_params": {"stop": ["x"], "top_k": [NaN]}}',
        "sampling_params.top_k[0]",
    )
    assert with_non_finite({"text": "hi"}, "1e999") == (
        b'{"text": "hi", "temperature": 1e999}',
        "temperature",
    )


def test_a_case_without_an_answer_is_a_failure_naming_it() -> None:
    """A server that takes the connection and never answers (a listening socket nobody
    accepts on: a hung server) and one that refuses it (a bound port nobody listens on)."""
    report = FuzzReport()
    with socket.socket() as hung, socket.socket() as closed:
        hung.bind(("127.0.0.1", 0))
        hung.listen()
        closed.bind(("127.0.0.1", 0))
        for name, sock in (("hung", hung), ("refused", closed)):
            url = f"http://127.0.0.1:{sock.getsockname()[1]}"
            with httpx.Client(base_url=url, timeout=1) as client:
                got = send_case(client, "/generate", b'{"text": "hi"}', f"POST {name}", report)
            assert got is None
    assert len(report.failures) == 2, report.failures
    assert report.failures[0].startswith("POST hung: no answer (ReadTimeout"), report.failures
    assert report.failures[1].startswith("POST refused: no answer (ConnectError"), report.failures
    assert all(f.endswith("""<- b'{"text": "hi"}'""") for f in report.failures)
