"""From a request's grammar fields (json_schema, regex, ebnf, structural_tag) to its
`GrammarKey`, the edge's syntax check of them, and the backend registry (`--grammar-backend`).

Runs at the HTTP edge (the check: a bad grammar is a 400 naming its field) and in the scheduler
process (the key and the backend).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

from .base_grammar_backend import BaseGrammarBackend, GrammarKey, error_reason
from .xgrammar_backend import JsonOptions, XGrammarBackend, build_grammar


class GrammarFields(Protocol):
    """The constrained-decoding fields of SamplingParams (at most one is set)."""

    @property
    def json_schema(self) -> str | None: ...
    @property
    def regex(self) -> str | None: ...
    @property
    def ebnf(self) -> str | None: ...
    @property
    def structural_tag(self) -> str | None: ...


def grammar_key(fields: GrammarFields) -> GrammarKey | None:
    """The key of the one grammar field that is set, or None."""
    if fields.json_schema is not None:
        return GrammarKey("json", fields.json_schema)
    if fields.regex is not None:
        return GrammarKey("regex", fields.regex)
    if fields.ebnf is not None:
        return GrammarKey("ebnf", fields.ebnf)
    if fields.structural_tag is not None:
        return GrammarKey("structural_tag", fields.structural_tag)
    return None


def check_grammar(fields: GrammarFields) -> None:
    """ValueError "<field>: <why>" when the grammar field does not parse (no tokenizer needed:
    the scheduler then compiles exactly this grammar)."""
    key = grammar_key(fields)
    error = None if key is None else grammar_error(key)
    if key is not None and error is not None:
        raise ValueError(f"{key.field}: {error}")


def grammar_error(key: GrammarKey) -> str | None:
    """Why `key` is not a valid grammar ("invalid regular expression: ..."), or None."""
    try:
        build_grammar(key)
    except (ValueError, RuntimeError) as exc:
        return f"invalid {_what(key)}: {error_reason(exc)}"
    return None


def _what(key: GrammarKey) -> str:
    return {
        "json": "JSON schema",
        "regex": "regular expression",
        "ebnf": "EBNF grammar",
        "structural_tag": "structural tag",
    }[key.kind]


def create_grammar_backend(
    name: str,
    tokenizer: Callable[[], Any],
    vocab_size: int,
    stop_token_ids: Sequence[int],
    options: JsonOptions,
) -> BaseGrammarBackend | None:
    """The backend `--grammar-backend` names (`tokenizer` loads the model's tokenizer when the
    backend first needs it); None for "none"."""
    if name == "none":
        return None
    if name == "xgrammar":
        return XGrammarBackend(tokenizer, vocab_size, stop_token_ids, options)
    raise ValueError(f"grammar_backend: unknown backend {name!r}")
