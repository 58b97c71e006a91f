"""The router's routing key of a chat request with `tools` is the engine's prompt: the same
tools reach the template on both sides (all of them, only the named one, none for
"none"), so a tenant's tool-using follow-ups land on the replica caching its prefix."""

from __future__ import annotations

from typing import Any

import pytest

from radixserve.router.tokenization import RouterTokenizer
from tests.router.tokenization_cases import CUSTOM_TEMPLATE

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}},
    {"function": {"name": "get_time", "description": "now"}},  # "type" left out
]
FOLLOW_UP = [
    {"role": "user", "content": "Weather in Paris?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "21 C"},
]  # fmt: skip


def _engine_ids(tokenizer: Any, body: dict[str, Any]) -> list[int]:
    from radixserve.engine.entrypoints.function_call import plan_tools
    from radixserve.engine.entrypoints.openai_protocol import ChatCompletionRequest
    from radixserve.engine.entrypoints.openai_serving import chat_prompt

    req = ChatCompletionRequest.model_validate(body)
    plan = plan_tools(req.tools, req.tool_choice, True, "hermes")
    kwargs = req.chat_template_kwargs
    return chat_prompt(tokenizer, req.messages, kwargs, tools=plan.template_tools)[1]


@pytest.mark.parametrize(
    "choice",
    [None, "auto", "required", "none", {"type": "function", "function": {"name": "get_time"}}],
)
@pytest.mark.parametrize("messages", [FOLLOW_UP[:1], FOLLOW_UP], ids=["first", "follow-up"])
def test_tool_requests_route_on_the_engines_prompt(
    engine_tokenizer: Any, router_tok: RouterTokenizer, choice: Any, messages: Any
) -> None:
    body: dict[str, Any] = {
        "messages": messages,
        "tools": TOOLS,
        "chat_template_kwargs": {"chat_template": CUSTOM_TEMPLATE},
    }
    if choice is not None:
        body["tool_choice"] = choice
    ids = router_tok.routing_tokens("/v1/chat/completions", body)
    assert ids == _engine_ids(engine_tokenizer, body)
    without = router_tok.routing_tokens(
        "/v1/chat/completions", {k: v for k, v in body.items() if k != "tools"}
    )
    assert (ids == without) == (choice == "none")
