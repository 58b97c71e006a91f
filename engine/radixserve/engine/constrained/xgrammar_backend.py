"""The xgrammar backend (`--grammar-backend xgrammar`): request fields → xgrammar grammars,
their compilation against the model's tokenizer, and the per-request matcher.

`build_grammar` is the one translation from a `GrammarKey` to an `xgrammar.Grammar`; it needs
no tokenizer, so the HTTP edge runs it too (`check_grammar_fields`) and rejects a bad schema,
regex or EBNF with a 400 before anything is scheduled. The scheduler process compiles the same
grammar against its tokenizer (`XGrammarBackend`, on the backend's worker thread).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    import xgrammar as xgr

from .base_grammar_backend import BaseGrammarBackend, BaseGrammarObject, GrammarKey

ANY_JSON = "$$ANY$$"  # SGLang's key for "any JSON value" (xgrammar's built-in JSON grammar)


@dataclass(frozen=True, slots=True)
class JsonOptions:
    """How JSON schemas compile (--constrained-json-disable-any-whitespace, ...-max-whitespace-
    cnt). Compact JSON keeps a small model from looping on whitespace."""

    any_whitespace: bool = True
    max_whitespace_cnt: int | None = None


def build_grammar(key: GrammarKey, options: JsonOptions = JsonOptions()) -> xgr.Grammar:
    """The xgrammar grammar of `key`; ValueError (or xgrammar's RuntimeError) when invalid."""
    import xgrammar as xgr  # ~0.2 s beyond transformers: paid where a grammar first comes

    if "\x00" in key.text:  # xgrammar's C++ side stops at NUL: refuse rather than truncate
        raise ValueError("must not contain NUL characters")
    if key.kind == "json":
        if key.text == ANY_JSON:
            return xgr.Grammar.builtin_json_grammar()
        schema = _json_value(key.text, "a JSON schema")
        if not isinstance(schema, dict | bool):
            raise ValueError("a JSON schema must be an object (or true / false)")
        return xgr.Grammar.from_json_schema(
            key.text,
            any_whitespace=options.any_whitespace,
            max_whitespace_cnt=options.max_whitespace_cnt,
        )
    if key.kind == "regex":
        return xgr.Grammar.from_regex(key.text)
    if key.kind == "ebnf":
        return xgr.Grammar.from_ebnf(key.text)
    return xgr.Grammar.from_structural_tag(_structural_tag(key.text))


def _json_value(text: str, what: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as exc:
        raise ValueError(f"not valid JSON ({what}): {exc}") from None


def _structural_tag(text: str) -> Any:
    """xgrammar's structural tag: the `{"format": …}` form as it is, SGLang's legacy
    `{"structures": [{begin, schema, end}], "triggers": […]}` converted."""
    tag = _json_value(text, "a structural tag")
    if not isinstance(tag, dict):
        raise ValueError("a structural tag must be an object")
    if "structures" not in tag:
        return text
    structures, triggers = tag.get("structures"), tag.get("triggers")
    if not isinstance(structures, list) or not isinstance(triggers, list):
        raise ValueError("structures and triggers must be lists")
    try:
        tags = [
            {
                "type": "tag",
                "begin": s["begin"],
                "content": {"type": "json_schema", "json_schema": s.get("schema") or {}},
                "end": s["end"],
            }
            for s in structures
        ]
    except (KeyError, TypeError) as exc:
        raise ValueError(f"each structure needs begin, schema and end: {exc}") from None
    fmt = {
        "type": "triggered_tags",
        "triggers": triggers,
        "tags": tags,
        "at_least_one": bool(tag.get("at_least_one", False)),
        "stop_after_first": bool(tag.get("stop_after_first", False)),
    }
    return json.dumps({"type": "structural_tag", "format": fmt})


class XGrammarGrammar(BaseGrammarObject):
    """One request's xgrammar matcher."""

    def __init__(self, compiled: xgr.CompiledGrammar, stop_token_ids: Sequence[int]) -> None:
        import xgrammar as xgr

        self.compiled = compiled
        self.stop_token_ids = list(stop_token_ids)
        self.matcher = xgr.GrammarMatcher(
            compiled, override_stop_tokens=self.stop_token_ids or None
        )

    def accept_token(self, token_id: int) -> bool:
        return bool(self.matcher.accept_token(token_id))

    def fill_vocab_mask(self, mask: torch.Tensor, row: int) -> None:
        self.matcher.fill_next_token_bitmask(mask, row)

    def is_terminated(self) -> bool:
        return bool(self.matcher.is_terminated())

    def copy(self) -> XGrammarGrammar:
        return XGrammarGrammar(self.compiled, self.stop_token_ids)


class XGrammarBackend(BaseGrammarBackend):
    """Compiles against the model's tokenizer; the given stop ids and the tokenizer's EOS end
    every grammar. The tokenizer and xgrammar's vocabulary tables are built by the worker
    thread at the first compilation (~0.7 s on 2 cores): a server's start-up does not wait for
    them, and one that never sees a grammar never builds them."""

    def __init__(
        self,
        tokenizer: Callable[[], Any],
        vocab_size: int,
        stop_token_ids: Sequence[int],
        options: JsonOptions = JsonOptions(),
    ) -> None:
        super().__init__(vocab_size)
        self.options = options
        self._load_tokenizer = tokenizer
        self.stop_token_ids = sorted(set(stop_token_ids))
        self._compiler: Any = None  # xgrammar's GrammarCompiler, once built

    def _grammar_compiler(self) -> Any:
        """The compiler, built on first use (worker thread only)."""
        if self._compiler is None:
            import xgrammar as xgr

            tokenizer = self._load_tokenizer()
            if tokenizer.eos_token_id is not None:
                self.stop_token_ids = sorted({*self.stop_token_ids, tokenizer.eos_token_id})
            info = xgr.TokenizerInfo.from_huggingface(
                tokenizer, vocab_size=self.vocab_size, stop_token_ids=self.stop_token_ids
            )
            # one compile thread: the backend's worker; xgrammar's own pool would take the
            # cores the forward needs
            self._compiler = xgr.GrammarCompiler(info, max_threads=1)
        return self._compiler

    def compile(self, key: GrammarKey) -> XGrammarGrammar:
        compiled = self._grammar_compiler().compile_grammar(build_grammar(key, self.options))
        return XGrammarGrammar(compiled, self.stop_token_ids)

    def reset(self) -> None:
        super().reset()
        if self._compiler is not None:
            self._compiler.clear_cache()
