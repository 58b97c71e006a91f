"""Request bodies of the HTTP API (engine and router alike) as pydantic models, and the OpenAPI
document that describes them; imports no torch.

The OpenAI models validate /v1/completions and /v1/chat/completions in the engine. The native
models (`GenerateRequest`, ...) only describe the bodies that the engine's routes check by hand
(request_builder), so that /openapi.json says what a route really takes; the router forwards
the same bodies and publishes the same schemas. Routes read the raw body (a pydantic body
parameter would hide client disconnects and rename the engine's error messages), so the bodies
are attached with `describe_request_bodies` instead of through route signatures.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema

MAX_N = 128
MAX_TOP_LOGPROBS = 20
COMPLETION_DEFAULT_MAX_TOKENS = 16  # OpenAI's and SGLang's default for /v1/completions

_STRINGS = {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]}
_IDS = {"type": "array", "items": {"type": "integer"}}
# Checked by hand after pydantic (the engine's own messages), described here for the schema.
Stop = Annotated[Any, WithJsonSchema({"anyOf": [*_STRINGS["anyOf"], {"type": "null"}]})]
PromptField = Annotated[
    Any, WithJsonSchema({"anyOf": [*_STRINGS["anyOf"], _IDS, {"type": "array", "items": _IDS}]})
]


# Request fields passed to the engine under the same name when set.
_SAME_NAME = (
    "temperature",
    "top_p",
    "n",
    "stop",
    "frequency_penalty",
    "presence_penalty",
    "logit_bias",
    "top_k",
    "min_p",
    "repetition_penalty",
    "ignore_eos",
    "skip_special_tokens",
    "spaces_between_special_tokens",
    "no_stop_trim",
    "stop_token_ids",
    "regex",
    "ebnf",
)


class StreamOptions(BaseModel):
    include_usage: bool = False


class SamplingRequest(BaseModel):
    """Fields shared by completions and chat: OpenAI's, then SGLang's extras."""

    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    n: int = Field(1, ge=1, le=MAX_N)
    stop: Stop = None  # str | list[str]: checked by SamplingParams
    seed: int | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None  # accepted and ignored
    # SGLang extras
    top_k: int | None = None
    min_p: float | None = None
    min_tokens: int | None = None
    repetition_penalty: float | None = None
    ignore_eos: bool | None = None
    skip_special_tokens: bool | None = None
    spaces_between_special_tokens: bool | None = None
    no_stop_trim: bool | None = None
    stop_token_ids: list[int] | None = None
    data_parallel_rank: int | None = None  # pin to one DP rank (the router sends it)
    # prefill/decode disaggregation: the prefill's bootstrap server and the request's room
    # (a PD router sends them to both servers; docs/disaggregation.md)
    bootstrap_host: str | list[str] | None = None
    bootstrap_port: int | list[int | None] | None = None
    bootstrap_room: int | list[int] | None = None
    # constrained decoding: SGLang's extras, and OpenAI's response_format (taken on completions
    # too, as SGLang and vLLM do)
    json_schema: str | dict[str, Any] | None = None
    regex: str | None = None
    ebnf: str | None = None
    response_format: dict[str, Any] | None = None

    @property
    def include_usage(self) -> bool:
        return bool(self.stream and self.stream_options and self.stream_options.include_usage)

    def sampling_params(self, max_new_tokens: int | None) -> dict[str, Any]:
        """The engine's sampling_params dict (only what was set; the engine has the defaults)."""
        params = {k: getattr(self, k) for k in _SAME_NAME if getattr(self, k) is not None}
        if max_new_tokens is not None:
            params["max_new_tokens"] = max_new_tokens
        if self.min_tokens is not None:
            params["min_new_tokens"] = self.min_tokens
        if self.seed is not None:
            params["sampling_seed"] = self.seed
        if self.json_schema is not None:
            params["json_schema"] = self.json_schema
        return params


class CompletionRequest(SamplingRequest):
    prompt: PromptField  # str | list[str] | list[int] | list[list[int]]: see prompt_list
    max_tokens: int | None = COMPLETION_DEFAULT_MAX_TOKENS
    echo: bool = False
    logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    suffix: str | None = None


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: str
    text: str | None = None


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: str
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None  # an assistant's earlier calls
    tool_call_id: str | None = None  # a tool message: the call it answers
    reasoning_content: str | None = None  # accepted, not shown to the template


class ChatCompletionRequest(SamplingRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    tools: list[Any] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool = True
    chat_template_kwargs: dict[str, Any] | None = None
    separate_reasoning: bool = True  # SGLang: reasoning_content apart (--reasoning-parser)


# ---- native bodies (schema only: the engine checks them in request_builder) -------------------


class NativeSamplingParams(BaseModel):
    """SGLang's `sampling_params` object (unknown keys are a 400)."""

    model_config = ConfigDict(extra="forbid")

    max_new_tokens: int = Field(128, ge=0)
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    temperature: float = Field(1.0, ge=0.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = -1
    min_p: float = Field(0.0, ge=0.0, le=1.0)
    frequency_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    presence_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    repetition_penalty: float = Field(1.0, gt=0.0, le=2.0)
    min_new_tokens: int = Field(0, ge=0)
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    no_stop_trim: bool = False
    n: int = Field(1, ge=1, le=MAX_N)
    sampling_seed: int | None = None
    logit_bias: dict[str, float] | None = None
    json_schema: str | dict[str, Any] | None = None
    regex: str | None = None
    ebnf: str | None = None
    structural_tag: str | dict[str, Any] | None = None


class GenerateRequest(BaseModel):
    """/generate: exactly one of `text` / `input_ids`, single or batched."""

    text: str | list[str] | None = None
    input_ids: list[int] | list[list[int]] | None = None
    sampling_params: NativeSamplingParams | list[NativeSamplingParams] | None = None
    stream: bool = False
    return_logprob: bool = False
    top_logprobs_num: int = Field(0, ge=0, le=MAX_TOP_LOGPROBS)
    data_parallel_rank: int | None = None
    bootstrap_host: str | list[str] | None = None
    bootstrap_port: int | list[int | None] | None = None
    bootstrap_room: int | list[int] | None = None


class TokenizeRequest(BaseModel):
    """/tokenize: a text `prompt`, or chat `messages` templated as chat completions do."""

    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_generation_prompt: bool = True
    chat_template_kwargs: dict[str, Any] | None = None


class DetokenizeRequest(BaseModel):
    tokens: list[int]


class AbortRequest(BaseModel):
    rid: str = Field(min_length=1)


INFERENCE_BODIES: Mapping[str, type[BaseModel]] = {
    "/generate": GenerateRequest,
    "/v1/completions": CompletionRequest,
    "/v1/chat/completions": ChatCompletionRequest,
}
ENGINE_BODIES: Mapping[str, type[BaseModel]] = {
    **INFERENCE_BODIES,
    "/tokenize": TokenizeRequest,
    "/detokenize": DetokenizeRequest,
    "/abort_request": AbortRequest,
}

_REF = "#/components/schemas/{model}"
_ERROR_SCHEMA = {
    "type": "object",
    "required": ["object", "message", "type", "code"],
    "properties": {
        "object": {"const": "error"},
        "message": {"type": "string"},
        "type": {"type": "string"},
        "param": {"type": ["string", "null"]},
        "code": {"type": "integer"},
    },
}


def _json(name: str) -> dict[str, Any]:
    return {"application/json": {"schema": {"$ref": _REF.format(model=name)}}}


def describe_request_bodies(
    document: dict[str, Any], bodies: Mapping[str, type[BaseModel]]
) -> dict[str, Any]:
    """`document` (an OpenAPI dict) with each path's POST taking its model as a JSON body and
    answering 400 with the error object; the models land in components/schemas."""
    schemas = document.setdefault("components", {}).setdefault("schemas", {})
    schemas["ErrorResponse"] = _ERROR_SCHEMA
    for path, model in bodies.items():
        post = document.get("paths", {}).get(path, {}).get("post")
        if post is None:
            continue
        schema = model.model_json_schema(ref_template=_REF)
        schemas.update(schema.pop("$defs", {}))
        schemas[model.__name__] = schema
        post["requestBody"] = {"required": True, "content": _json(model.__name__)}
        post.setdefault("responses", {})["400"] = {
            "description": "bad request: `param` names the field",
            "content": _json("ErrorResponse"),
        }
    return document


def openapi_with_bodies(
    build: Callable[[], dict[str, Any]], bodies: Mapping[str, type[BaseModel]]
) -> Callable[[], dict[str, Any]]:
    """An `app.openapi` replacement: FastAPI's document (built once) plus the request bodies."""
    cache: list[dict[str, Any]] = []

    def openapi() -> dict[str, Any]:
        if not cache:
            cache.append(describe_request_bodies(build(), bodies))
        return cache[0]

    return openapi
