"""Structured outputs on a live server, judged by the official `openai` client and jsonschema:
`response_format` (json_schema with strict, json_object, a pydantic model through
`chat.completions.parse`), the 24 schemas streamed and not at temperature 0 and at the
server's default sampling, regexes and EBNF on /generate, and malformed grammars refused with a
400 naming the field while the server stays healthy."""

from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import openai
import pytest
from pydantic import BaseModel, Field

from tests.engine.constrained.oracles import ebnf_ok, json_prefix_ok, schema_error
from tests.engine.constrained.schemas import EBNFS, REGEXES, SCHEMAS
from tests.engine.server.live_server import LiveServer

MODEL = "smollm2-135m"


@pytest.fixture(scope="module")
def server(structured_server: LiveServer) -> LiveServer:
    return structured_server


@pytest.fixture(scope="module")
def client(server: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="x", max_retries=0, timeout=300)


class Person(BaseModel):
    name: str = Field(max_length=20)
    age: int = Field(ge=0, le=120)
    hobbies: list[str] = Field(max_length=3)


def test_parse_returns_a_pydantic_object(client: openai.OpenAI) -> None:
    completion = client.beta.chat.completions.parse(
        model=MODEL,
        messages=[{"role": "user", "content": "Describe a person."}],
        response_format=Person,
        max_tokens=200,
        # Greedy: sampled, the 135M model sometimes spends the budget on the whitespace JSON
        # allows between tokens (the default-sampling test accepts such a cut as a prefix).
        temperature=0,
    )
    parsed = completion.choices[0].message.parsed
    assert isinstance(parsed, Person)
    assert 0 <= parsed.age <= 120


def _chat_json(
    client: openai.OpenAI, prompt: str, schema: dict[str, Any], greedy: bool, stream: bool
) -> tuple[str, str | None]:
    """The answer's text and finish_reason."""
    kw: dict[str, Any] = {
        "model": MODEL,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": 300,
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "answer", "schema": schema, "strict": True},
        },
    }
    if greedy:
        kw["temperature"] = 0
    if not stream:
        choice = client.chat.completions.create(**kw).choices[0]
        return choice.message.content or "", choice.finish_reason
    pieces, finish = [], None
    for chunk in client.chat.completions.create(stream=True, **kw):
        if chunk.choices and chunk.choices[0].delta.content:
            pieces.append(chunk.choices[0].delta.content)
        if chunk.choices and chunk.choices[0].finish_reason:
            finish = chunk.choices[0].finish_reason
    return "".join(pieces), finish


def _answer_error(
    text: str, finish: str | None, schema: dict[str, Any], greedy: bool
) -> str | None:
    """Every answer the grammar ended must validate. Sampled, the 135M model sometimes writes
    one string until max_tokens: what the grammar guarantees then is a prefix it accepts."""
    if not greedy and finish == "length":
        return None if json_prefix_ok(text, schema) else f"not a valid prefix: {text[:200]!r}"
    return schema_error(text, schema)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("greedy", [True, False], ids=["temperature-0", "default-sampling"])
def test_every_schema_answer_validates(client: openai.OpenAI, greedy: bool, stream: bool) -> None:
    with ThreadPoolExecutor(len(SCHEMAS)) as pool:
        outs = list(pool.map(lambda ps: _chat_json(client, ps[0], ps[1], greedy, stream), SCHEMAS))
    errors = {
        p: _answer_error(text, finish, s, greedy)
        for (p, s), (text, finish) in zip(SCHEMAS, outs, strict=True)
    }
    assert {p: e for p, e in errors.items() if e} == {}
    if greedy:
        assert all(finish == "stop" for _, finish in outs), [f for _, f in outs]


def test_json_object_is_an_object(client: openai.OpenAI) -> None:
    out = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Give me a JSON object with a name and an age."}],
        response_format={"type": "json_object"},
        max_tokens=300,
        temperature=0,
    )
    assert out.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(out.choices[0].message.content or ""), dict)


def test_regexes_and_ebnf_on_generate(server: LiveServer) -> None:
    prompts = [p for p, _ in REGEXES] + [p for p, _, _ in EBNFS]
    params = [{"regex": r} for _, r in REGEXES] + [{"ebnf": g} for _, g, _ in EBNFS]
    for p in params:
        p["max_new_tokens"] = 64
    body = {"text": prompts, "sampling_params": params}
    outs = httpx.post(server.base_url + "/generate", json=body, timeout=300).json()
    for (_, regex), out in zip(REGEXES, outs, strict=False):
        assert re.fullmatch(regex, out["text"]), (regex, out["text"])
    for (_, _, name), out in zip(EBNFS, outs[len(REGEXES) :], strict=True):
        assert ebnf_ok(name, out["text"]), out["text"]


def test_completions_take_sglang_grammar_fields(client: openai.OpenAI) -> None:
    out = client.completions.create(
        model=MODEL, prompt="Answer yes or no:", max_tokens=8, extra_body={"regex": "(yes|no)"}
    )
    assert out.choices[0].text in ("yes", "no")


def test_completions_take_response_format(client: openai.OpenAI) -> None:
    """As SGLang's and vLLM's /v1/completions do (it was ignored here before)."""
    prompt, schema = SCHEMAS[0]
    fmt = {"type": "json_schema", "json_schema": {"name": "a", "schema": schema}}
    out = client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=300, temperature=0,
        extra_body={"response_format": fmt},
    )  # fmt: skip
    assert out.choices[0].finish_reason == "stop"
    assert schema_error(out.choices[0].text, schema) is None, out.choices[0].text


BAD_GRAMMARS = [
    ("/generate", {"text": "x", "sampling_params": {"json_schema": '{"type": 5}'}}, "json_schema"),
    ("/generate", {"text": "x", "sampling_params": {"regex": "(a"}}, "regex"),
    ("/generate", {"text": "x", "sampling_params": {"ebnf": "root ::= nope"}}, "ebnf"),
    ("/generate", {"text": "x", "sampling_params": {"json_schema": "{"}}, "json_schema"),
    ("/generate", {"text": "x", "sampling_params": {"regex": "a", "ebnf": "root ::= \"a\""}},
     "ebnf"),
    ("/generate", {"text": "x", "sampling_params": {"json_schema": '{"$ref": "#/nowhere"}'}},
     "json_schema"),
    ("/v1/chat/completions", {"response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "object", "properties": {"a": {"type": 7}}}}}},
     "response_format.json_schema.schema"),
    ("/v1/chat/completions", {"response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": [1]}}}, "response_format.json_schema.schema"),
    ("/v1/chat/completions", {"response_format": {"type": "yaml"}}, "response_format.type"),
    ("/v1/chat/completions", {"regex": "[z-a]"}, "regex"),
    ("/v1/completions", {"json_schema": "nope"}, "json_schema"),
    ("/v1/completions", {"response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "nope"}}}}, "response_format.json_schema.schema"),
]  # fmt: skip


@pytest.mark.parametrize(("path", "body", "field"), BAD_GRAMMARS)
def test_bad_grammars_are_400s_naming_the_field(
    server: LiveServer, path: str, body: dict[str, Any], field: str
) -> None:
    if path == "/v1/chat/completions":
        body = {"messages": [{"role": "user", "content": "hi"}], **body}
    elif path == "/v1/completions":
        body = {"prompt": "hi", **body}
    r = httpx.post(server.base_url + path, json=body, timeout=60)
    assert r.status_code == 400, r.text
    assert r.json()["param"] == field, r.json()
    assert httpx.get(server.base_url + "/health", timeout=10).status_code == 200
