"""Constrained decoding: grammar backends (xgrammar), per-request grammar state, token bitmasks.

Re-exports the public names of `base_grammar_backend`, `xgrammar_backend` and `grammar_fields`.
"""

from __future__ import annotations

from .base_grammar_backend import (
    BaseGrammarBackend,
    BaseGrammarObject,
    CompileResult,
    GrammarKey,
    InvalidGrammar,
    fill_vocab_masks,
)
from .grammar_fields import check_grammar, create_grammar_backend, grammar_error, grammar_key
from .reasoner_grammar import THINK_END, ReasonerGrammar
from .xgrammar_backend import ANY_JSON, JsonOptions, XGrammarBackend, build_grammar

__all__ = [
    "ANY_JSON",
    "THINK_END",
    "BaseGrammarBackend",
    "BaseGrammarObject",
    "CompileResult",
    "GrammarKey",
    "InvalidGrammar",
    "JsonOptions",
    "ReasonerGrammar",
    "XGrammarBackend",
    "build_grammar",
    "check_grammar",
    "create_grammar_backend",
    "fill_vocab_masks",
    "grammar_error",
    "grammar_key",
]
