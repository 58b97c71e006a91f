"""Router-side token ids equal the engine's: in process against the engine's own code and
tokenizer (SmolLM2), and over HTTP against a live engine's /tokenize and usage counts."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from radixserve.router.tokenization import RouterTokenizer
from tests.router.tokenization_cases import (
    BAD_CONVERSATIONS,
    CONVERSATIONS,
    PROMPTS,
    TEMPLATE_KWARGS,
    TOOLS,
)

ERROR = "error"  # stands for "rejected" on either side


@dataclass(frozen=True)
class EngineSide:
    """What the engine's request parsers read from ServerState: its tokenizer, a real (not
    started) TokenizerManager and the limits requests are validated against."""

    tokenizer: Any
    tokenizer_manager: Any
    limits: Any


def engine_side(tokenizer: Any) -> EngineSide:
    from radixserve.engine.entrypoints.request_builder import ServerLimits
    from radixserve.engine.ipc.channels import PortArgs
    from radixserve.engine.tokenizer.metrics import EngineMetrics
    from radixserve.engine.tokenizer.tokenizer_manager import TokenizerManager

    limits = ServerLimits(8192, 8192, len(tokenizer))
    ports = PortArgs("ipc://unused-1", "ipc://unused-2", "ipc://unused-3")  # never started
    tm = TokenizerManager(tokenizer, ports, EngineMetrics("smollm2-135m"))
    return EngineSide(tokenizer, tm, limits)


def engine_chat_ids(side: EngineSide, messages: Any, kwargs: Any = None) -> Any:
    """The engine's /v1/chat/completions prompt ids (pydantic parsing, then chat_prompt)."""
    from radixserve.engine.entrypoints.openai_protocol import ChatCompletionRequest
    from radixserve.engine.entrypoints.openai_serving import chat_prompt

    try:
        req = ChatCompletionRequest.model_validate(
            {"messages": messages, "chat_template_kwargs": kwargs}
        )
        return chat_prompt(side.tokenizer, req.messages, req.chat_template_kwargs)[1]
    except (ValidationError, ValueError):  # InvalidRequest is a ValueError
        return ERROR


def router_chat_ids(tok: RouterTokenizer, messages: Any, kwargs: Any = None) -> Any:
    try:
        return tok.encode_chat(messages, kwargs)
    except ValueError:
        return ERROR


# ---- in process -------------------------------------------------------------------------------


def test_text_prompts_encode_like_the_engine(
    engine: EngineSide, router_tok: RouterTokenizer
) -> None:
    for prompt in PROMPTS:
        assert router_tok.encode_prompt(prompt) == engine.tokenizer_manager.tokenize(prompt), prompt


@settings(max_examples=300, deadline=None)
@given(text=st.text(max_size=200))
def test_any_text_encodes_like_the_engine(
    engine: EngineSide, router_tok: RouterTokenizer, text: str
) -> None:
    assert router_tok.encode_prompt(text) == engine.tokenizer_manager.tokenize(text)


def test_conversations_encode_like_the_engine(
    engine: EngineSide, router_tok: RouterTokenizer
) -> None:
    for messages in CONVERSATIONS:
        expected = engine_chat_ids(engine, messages)
        assert expected != ERROR
        assert router_chat_ids(router_tok, messages) == expected, messages


def test_bad_conversations_are_refused_by_both(
    engine: EngineSide, router_tok: RouterTokenizer
) -> None:
    for messages in BAD_CONVERSATIONS:
        assert engine_chat_ids(engine, messages) == ERROR, messages
        with pytest.raises(ValueError, match=r"^messages"):
            router_tok.encode_chat(messages)


@pytest.mark.parametrize(("kwargs", "refused"), TEMPLATE_KWARGS, ids=range(len(TEMPLATE_KWARGS)))
def test_chat_template_kwargs_render_like_the_engine(
    engine: EngineSide, router_tok: RouterTokenizer, kwargs: Any, refused: bool
) -> None:
    for messages in (CONVERSATIONS[2], CONVERSATIONS[8]):
        expected = engine_chat_ids(engine, messages, kwargs)
        assert (expected == ERROR) is refused
        assert router_chat_ids(router_tok, messages, kwargs) == expected


def test_template_errors_name_the_field(router_tok: RouterTokenizer) -> None:
    bad = {"chat_template": "{{ raise_exception('refused by template') }}"}
    with pytest.raises(ValueError, match=r"^messages: .*refused by template"):
        router_tok.encode_chat(CONVERSATIONS[0], bad)
    with pytest.raises(ValueError, match=r"^chat_template_kwargs: 'tokenize'"):
        router_tok.encode_chat(CONVERSATIONS[0], {"tokenize": True})


def test_bos_is_added_once_with_an_add_bos_tokenizer(engine_tokenizer: Any, tmp_path: Path) -> None:
    """With add_bos_token, a template that writes BOS itself gets no second one; one that does
    not gets the tokenizer's."""
    from transformers import AutoTokenizer

    from radixserve.engine.entrypoints.http_server import tokenizer_info

    engine_tokenizer.save_pretrained(tmp_path)
    hf = AutoTokenizer.from_pretrained(str(tmp_path), add_bos_token=True)
    side, tok = engine_side(hf), RouterTokenizer.from_info(tokenizer_info(hf))
    starts = {"chat_template": "{{ bos_token }}{{ messages[0]['content'] }}"}
    plain = {"chat_template": "{{ messages[0]['content'] }}"}
    for kwargs in (None, starts, plain):
        ids = router_chat_ids(tok, CONVERSATIONS[0], kwargs)
        assert ids == engine_chat_ids(side, CONVERSATIONS[0], kwargs)
        # the default template opens three turns (system, user, assistant); the others write one
        assert ids.count(hf.bos_token_id) == (3 if kwargs is None else 1)
    for prompt in PROMPTS:
        assert tok.encode_prompt(prompt) == side.tokenizer_manager.tokenize(prompt)


NAMED_TEMPLATES = [
    {"name": "default", "template": "D {{ messages | length }} {{ tools is none }}"},
    {"name": "tool_use", "template": "T {{ tools | tojson }} {{ messages[0]['content'] }}"},
]


@pytest.mark.parametrize(
    "config",
    [{}, {"add_bos_token": True, "add_eos_token": True}, {"chat_template": NAMED_TEMPLATES}],
    ids=["as-saved", "add-bos-eos", "named-templates"],
)
def test_from_file_reads_a_saved_tokenizer_like_transformers(
    engine_tokenizer: Any, tmp_path: Path, config: dict[str, Any]
) -> None:
    from transformers import AutoTokenizer

    engine_tokenizer.save_pretrained(tmp_path)
    cfg_path = tmp_path / "tokenizer_config.json"
    cfg_path.write_text(json.dumps({**json.loads(cfg_path.read_text()), **config}))
    if "chat_template" in config:  # the template file would take priority over the config
        (tmp_path / "chat_template.jinja").unlink()
    hf = AutoTokenizer.from_pretrained(str(tmp_path))
    side, tok = engine_side(hf), RouterTokenizer.from_file(tmp_path / "tokenizer.json")
    for prompt in PROMPTS:
        assert tok.encode_prompt(prompt) == side.tokenizer_manager.tokenize(prompt), prompt
    for kwargs in (None, {"tools": TOOLS}, {"chat_template": "tool_use"}):
        for messages in CONVERSATIONS:
            expected = engine_chat_ids(side, messages, kwargs)
            assert router_chat_ids(tok, messages, kwargs) == expected


def test_from_info_rejects_a_bad_description() -> None:
    with pytest.raises(ValueError, match=r"^tokenizer_json"):
        RouterTokenizer.from_info({"chat_template": "x"})
    with pytest.raises(ValueError, match=r"^tokenizer_json"):
        RouterTokenizer.from_info({"tokenizer_json": "{not json"})


# ---- routing_tokens: which prompt of each body shape -------------------------------------------


def engine_routing_ids(side: EngineSide, path: str, body: dict[str, Any]) -> list[int] | None:
    """The ids of the first prompt the engine itself derives from the body (None: refused)."""
    from radixserve.engine.entrypoints.http_server import generate_inputs
    from radixserve.engine.entrypoints.openai_protocol import prompt_list
    from radixserve.engine.entrypoints.request_builder import check_prompt

    try:
        if path == "/generate":
            inputs, _ = generate_inputs(side, body)  # type: ignore[arg-type]
            return list(inputs[0].input_ids) if inputs else None
        if path == "/v1/completions":
            prompts = prompt_list(body.get("prompt"), side.tokenizer_manager.tokenize)
            for prompt in prompts:  # the route's per-prompt checks (empty, too long)
                check_prompt(prompt.input_ids, 1, side.limits)
            return prompts[0][1]
    except ValueError:
        return None
    ids = engine_chat_ids(side, body.get("messages"), body.get("chat_template_kwargs"))
    return None if ids == ERROR else ids


ROUTING_BODIES: list[tuple[str, dict[str, Any]]] = [
    ("/generate", {"text": "hello world"}),
    ("/generate", {"text": ["first prompt", "second"]}),
    ("/generate", {"input_ids": [5, 6, 7]}),
    ("/generate", {"input_ids": [[8, 9], [10]]}),
    ("/generate", {"text": "both", "input_ids": [1]}),
    ("/generate", {}),
    ("/generate", {"text": [5]}),
    ("/generate", {"text": ["0", ""]}),  # found by the fuzz test below: the batch is a 400
    ("/generate", {"input_ids": [[8, 9], []]}),
    ("/v1/completions", {"prompt": "a completion"}),
    ("/v1/completions", {"prompt": ["one", "two"]}),
    ("/v1/completions", {"prompt": [11, 12, 13]}),
    ("/v1/completions", {"prompt": [[14, 15], [16]]}),
    ("/v1/completions", {"prompt": ["one", ""]}),
    ("/v1/completions", {"prompt": []}),
    ("/v1/completions", {"prompt": [[]]}),
    ("/v1/completions", {"prompt": ["mixed", 1]}),
    ("/v1/completions", {"prompt": [True, 2]}),
    ("/v1/completions", {}),
    ("/v1/chat/completions", {"messages": CONVERSATIONS[2]}),
    ("/v1/chat/completions", {"messages": CONVERSATIONS[1], "chat_template_kwargs": {"x": 1}}),
    ("/v1/chat/completions", {"messages": []}),
    ("/v1/chat/completions", {"messages": CONVERSATIONS[0], "chat_template_kwargs": "bad"}),
    ("/v1/chat/completions", {}),
]


@pytest.mark.parametrize(("path", "body"), ROUTING_BODIES, ids=range(len(ROUTING_BODIES)))
def test_routing_tokens_pick_the_engines_first_prompt(
    engine: EngineSide, router_tok: RouterTokenizer, path: str, body: dict[str, Any]
) -> None:
    assert router_tok.routing_tokens(path, body) == engine_routing_ids(engine, path, body)


def test_routing_tokens_of_other_paths_or_bodies_are_none(router_tok: RouterTokenizer) -> None:
    assert router_tok.routing_tokens("/v1/models", {"prompt": "x"}) is None
    assert router_tok.routing_tokens("/generate", ["not", "an", "object"]) is None  # type: ignore[arg-type]


# Bodies from outside: any JSON in the prompt fields (ids far outside the vocabulary and int64,
# wrong types, odd messages). The router never raises; it routes by the engine's own ids or not
# at all (None), never by ids the engine would refuse.
_ANY_ID = st.integers(min_value=-(2**70), max_value=2**70) | st.integers(0, 49151)
_JSON = st.recursive(
    st.none() | st.booleans() | _ANY_ID | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
_IDS = st.lists(_ANY_ID, max_size=6)
_MESSAGE = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "system", "assistant"]) | st.text(max_size=6)},
    optional={"content": st.text(max_size=30) | _JSON},
)
_BODIES = st.one_of(
    st.tuples(st.just("/generate"), st.fixed_dictionaries({}, optional={
        "text": st.text(max_size=30) | st.lists(st.text(max_size=10), max_size=3) | _JSON,
        "input_ids": _IDS | st.lists(_IDS, max_size=3) | _JSON,
    })),
    st.tuples(st.just("/v1/completions"), st.fixed_dictionaries({}, optional={
        "prompt": st.text(max_size=30) | _IDS | st.lists(_IDS, max_size=3) | _JSON,
    })),
    st.tuples(st.just("/v1/chat/completions"), st.fixed_dictionaries({}, optional={
        "messages": st.lists(_MESSAGE, max_size=3) | _JSON,
    })),
)  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(case=_BODIES)
def test_routing_tokens_of_any_body_are_the_engines_or_none(
    engine: EngineSide, router_tok: RouterTokenizer, case: tuple[str, dict[str, Any]]
) -> None:
    path, body = case
    ids = router_tok.routing_tokens(path, body)
    if ids is not None:
        assert ids == engine_routing_ids(engine, path, body)
        assert all(0 <= t < len(engine.tokenizer) for t in ids)


# ---- against a live engine over HTTP ----------------------------------------------------------


@pytest.fixture(scope="module")
def fetched(engine_server: Any) -> RouterTokenizer:
    async def fetch() -> RouterTokenizer:
        async with httpx.AsyncClient(timeout=30) as client:
            return await RouterTokenizer.fetch(client, engine_server.base_url + "/")

    return asyncio.run(fetch())


def _tokenize(server: Any, body: dict[str, Any]) -> Any:
    r = httpx.post(server.base_url + "/tokenize", json=body, timeout=30)
    if r.status_code == 400:
        assert r.json()["message"].startswith(("messages", "chat_template_kwargs")), r.text
        return ERROR
    assert r.status_code == 200, r.text
    return r.json()["tokens"]


def test_live_prompts_match_the_engines_tokenize(
    engine_server: Any, fetched: RouterTokenizer
) -> None:
    for prompt in PROMPTS:
        assert fetched.encode_prompt(prompt) == _tokenize(engine_server, {"prompt": prompt})


def test_live_chats_match_the_engines_tokenize(
    engine_server: Any, fetched: RouterTokenizer
) -> None:
    for messages in CONVERSATIONS + BAD_CONVERSATIONS:
        expected = _tokenize(engine_server, {"messages": messages})
        assert router_chat_ids(fetched, messages) == expected, messages
    for kwargs, _ in TEMPLATE_KWARGS:
        body = {"messages": CONVERSATIONS[2], "chat_template_kwargs": kwargs}
        assert router_chat_ids(fetched, CONVERSATIONS[2], kwargs) == _tokenize(engine_server, body)


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/generate", {"text": ["first prompt", "second"], "sampling_params": {}}),
        ("/v1/completions", {"prompt": ["Once upon a time, in a land far away"]}),
        ("/v1/chat/completions", {"messages": CONVERSATIONS[2]}),
        ("/v1/chat/completions", {"messages": CONVERSATIONS[5], "chat_template_kwargs": {"a": 1}}),
    ],
)
def test_live_prompt_token_counts_match_routing_tokens(
    engine_server: Any, fetched: RouterTokenizer, path: str, body: dict[str, Any]
) -> None:
    """The engine's own count of prompt tokens for the request the router routed."""
    ids = fetched.routing_tokens(path, body)
    assert ids
    if path == "/generate":
        body = {**body, "sampling_params": {"max_new_tokens": 1, "temperature": 0}}
        r = httpx.post(engine_server.base_url + path, json=body, timeout=60)
        assert r.status_code == 200, r.text
        assert r.json()[0]["meta_info"]["prompt_tokens"] == len(ids)
        return
    r = httpx.post(engine_server.base_url + path, json={**body, "max_tokens": 1}, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["prompt_tokens"] == len(ids)
