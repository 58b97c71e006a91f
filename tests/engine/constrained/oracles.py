"""Oracles for constrained outputs that are not ours: `jsonschema` for JSON, `re.fullmatch` for
regexes, Python's own parser for the EBNF grammars, and xgrammar's matcher (compiled here from
the tokenizer, independently of the engine) for the generated token sequences."""

from __future__ import annotations

import ast
import json
import re
from typing import Any

import jsonschema
import xgrammar as xgr

SHOPPING = re.compile(r"[1-9] (apples|pears|plums)(, [1-9] (apples|pears|plums)){0,3}")
ARITHMETIC_NODES = (ast.Expression, ast.BinOp, ast.Add, ast.Sub, ast.Constant)


def schema_error(text: str, schema: dict[str, Any]) -> str | None:
    """Why `text` is not a JSON document valid under `schema` (None when it is)."""
    try:
        jsonschema.validate(json.loads(text), schema)
    except (ValueError, jsonschema.ValidationError) as exc:
        return f"{type(exc).__name__}: {str(exc)[:200]}"
    return None


def json_prefix_ok(text: str, schema: dict[str, Any]) -> bool:
    """Whether `text` is a prefix of some JSON document valid under `schema`, by xgrammar's
    byte-level matcher (no tokenizer: a one-entry vocabulary, since only the text is checked)."""
    compiler = xgr.GrammarCompiler(xgr.TokenizerInfo(["a"]), max_threads=1)
    matcher = xgr.GrammarMatcher(compiler.compile_json_schema(json.dumps(schema)))
    return bool(matcher.accept_string(text))


def ebnf_ok(oracle: str, text: str) -> bool:
    if oracle == "shopping":
        return SHOPPING.fullmatch(text) is not None
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError:
        return False
    return all(isinstance(node, ARITHMETIC_NODES) for node in ast.walk(tree))


class XgrammarOracle:
    """Compiles grammars against the tokenizer and replays token ids through a matcher."""

    def __init__(self, tokenizer: Any, vocab_size: int, stop_ids: list[int]) -> None:
        info = xgr.TokenizerInfo.from_huggingface(
            tokenizer, vocab_size=vocab_size, stop_token_ids=stop_ids
        )
        self.compiler = xgr.GrammarCompiler(info, max_threads=1)
        self.stop_ids = set(stop_ids)

    def accepts(self, kind: str, grammar: str, ids: list[int], prefix: bool = False) -> bool:
        """Whether every id is allowed in turn and the grammar is complete at the end (a
        trailing stop id, when present, must terminate it); `prefix`: only the former (an
        output cut at max_new_tokens)."""
        if kind == "json":
            compiled = self.compiler.compile_json_schema(grammar)
        elif kind == "regex":
            compiled = self.compiler.compile_regex(grammar)
        else:
            compiled = self.compiler.compile_grammar(grammar)
        matcher = xgr.GrammarMatcher(compiled)
        if not all(matcher.accept_token(t) for t in ids):
            return False
        if prefix:
            return True
        if ids and ids[-1] in self.stop_ids:
            return bool(matcher.is_terminated())
        return bool(matcher.is_completed())
