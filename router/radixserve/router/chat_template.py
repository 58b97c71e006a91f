"""Chat templates rendered as the engine renders them, without transformers.

The engine (engine/entrypoints/openai_serving.py `chat_prompt`) validates the OpenAI messages,
flattens list-of-parts content, then calls transformers' `apply_chat_template(tokenize=False,
add_generation_prompt=True, **chat_template_kwargs)`. This module reproduces the rest of that
path (both take the messages from radixserve.protocol.request_fields): the same treatment of
`chat_template_kwargs` keys that are apply_chat_template's own parameters, and the same Jinja
environment (an immutable sandbox with trim_blocks, lstrip_blocks, loop controls, a
pass-through `{% generation %}` block, and the `raise_exception`, `strftime_now`, `tojson`,
`dict` and `namespace` helpers).

Every failure is a ValueError whose message starts with the field at fault ("messages: ...",
"messages.2.content: ...", "chat_template_kwargs: ...").
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from typing import Any

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.utils import Namespace

# apply_chat_template parameters that only matter when it tokenizes: with tokenize=False the
# engine's call swallows them, so they never reach the template.
_SWALLOWED = frozenset(
    {"padding", "truncation", "max_length", "return_tensors", "return_dict", "tokenizer_kwargs"}
)
# Keys that collide with arguments the engine (or transformers inside) already passes by name:
# Python raises "got multiple values for keyword argument".
_COLLIDING = frozenset(
    {"self", "conversation", "tokenize", "add_generation_prompt", "conversations", "messages"}
)
# Options that cannot work with tokenize=False / add_generation_prompt=True: transformers raises.
_REFUSED = ("return_assistant_tokens_mask", "continue_final_message", "sanitize_control_tokens")


# ---- the Jinja environment ----------------------------------------------------------------------


class _GenerationBlock(Extension):
    """`{% generation %}...{% endgeneration %}`: transformers uses it to mark assistant tokens
    for training masks; when rendering a prompt it outputs its body unchanged."""

    tags = {"generation"}

    def parse(self, parser: Any) -> nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller: Any) -> str:
        return str(caller())


class _SafeNamespace(Namespace):
    """`namespace()` that refuses underscore names, so templates cannot reach dunders."""

    def __init__(*args: Any, **kwargs: Any) -> None:  # noqa: N805 - Namespace's own signature
        self, rest = args[0], args[1:]
        attrs = dict(*rest, **kwargs)
        for key in attrs:
            _SafeNamespace.check_name(key)
        Namespace.__init__(self, attrs)

    def __setitem__(self, key: str, value: Any) -> None:
        _SafeNamespace.check_name(key)
        Namespace.__setitem__(self, key, value)

    @staticmethod
    def check_name(key: Any) -> None:
        if isinstance(key, str) and key.startswith("_"):
            raise jinja2.exceptions.SecurityError(f"namespace attribute {key!r} is not allowed")


@dataclass(frozen=True)
class _DictFactory:
    """`dict(...)` inside templates, without exposing the dict type itself."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any) -> dict[Any, Any]:
        return dict.fromkeys(*args)


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: Any = None,
    sort_keys: bool = False,
) -> str:
    # Plain json.dumps: Jinja's own tojson escapes <, >, & and ' for HTML, which would change
    # the prompt text.
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


@lru_cache(maxsize=16)
def compile_template(source: str) -> jinja2.Template:
    """One compiled template per source text (a router sees one or two)."""
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationBlock, loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["dict"] = _DictFactory()
    env.globals["namespace"] = _SafeNamespace
    template = env.from_string(source)
    # A plain dict instead of Jinja's ChainMap over the environment's globals (fixed from here
    # on): every render copies them into its context, ~4 µs per render through a ChainMap.
    template.globals = dict(template.globals)
    return template


# ---- apply_chat_template ------------------------------------------------------------------------


def _pick_template(model: str | dict[str, str], override: Any, tools: Any) -> str:
    """transformers' get_chat_template: a named template, the tool-use one, or the default."""
    if isinstance(model, dict):
        if override is not None and override in model:
            return model[override]
        if override is None:
            if tools is not None and "tool_use" in model:
                return model["tool_use"]
            if "default" not in model:
                raise ValueError(f"several chat templates and no default: {sorted(model)}")
            return model["default"]
    template = model if override is None else override
    if not isinstance(template, str):
        raise ValueError("chat_template_kwargs: chat_template must be a string")
    return template


def _check_entries(value: Any, what: str) -> None:
    """Tools and documents: a list of objects (transformers iterates whatever it is given)."""
    if value is None:
        return
    try:
        entries = list(value)
    except TypeError:
        raise ValueError(f"chat_template_kwargs: {what} must be a list of objects") from None
    if any(not isinstance(x, dict) for x in entries):
        raise ValueError(f"chat_template_kwargs: every entry of {what} must be an object")


def render_chat(
    template: str | dict[str, str],
    messages: list[dict[str, Any]],
    special_tokens: dict[str, str],
    template_kwargs: dict[str, Any] | None,
) -> str:
    """The prompt text `apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
    **template_kwargs)` renders, the tokenizer's special tokens passed as template variables."""
    if template_kwargs is not None and not isinstance(template_kwargs, dict):
        raise ValueError("chat_template_kwargs: expected an object")
    kwargs = dict(template_kwargs or {})
    clash = sorted(_COLLIDING & kwargs.keys())
    if clash:
        raise ValueError(f"chat_template_kwargs: {clash[0]!r} cannot be set")
    for key in _REFUSED:
        if kwargs.pop(key, None):
            raise ValueError(f"chat_template_kwargs: {key} is not supported for chat prompts")
    for key in _SWALLOWED:
        kwargs.pop(key, None)
    tools, documents = kwargs.pop("tools", None), kwargs.pop("documents", None)
    _check_entries(tools, "tools")
    _check_entries(documents, "documents")
    try:
        source = _pick_template(template, kwargs.pop("chat_template", None), tools)
        return compile_template(source).render(
            messages=messages,
            tools=None if tools is None else list(tools),
            documents=documents,
            add_generation_prompt=True,
            **{**special_tokens, **kwargs},
        )
    except Exception as exc:  # a template's failure is the client's messages
        raise ValueError(f"messages: cannot apply the chat template: {exc}") from None
