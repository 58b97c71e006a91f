"""XGrammarBackend: compiled off the calling thread, cached per key (invalid grammars too),
one independent matcher per request; fill_vocab_masks leaves rows without a grammar open; a
ReasonerGrammar constrains only after "</think>"."""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any

import pytest
import torch

from radixserve.engine.constrained import (
    GrammarKey,
    InvalidGrammar,
    JsonOptions,
    ReasonerGrammar,
    XGrammarBackend,
    fill_vocab_masks,
)
from radixserve.engine.model_loader import resolve_model
from radixserve.engine.model_loader.loader import load_tokenizer
from tests.conftest import SMOLLM

VOCAB = 49152


@pytest.fixture(scope="module")
def tok() -> Any:
    return load_tokenizer(resolve_model(SMOLLM))


@pytest.fixture(scope="module")
def backend(tok: Any) -> Any:
    loads: list[int] = []
    b = XGrammarBackend(lambda: loads.append(1) or tok, VOCAB, [tok.eos_token_id], JsonOptions())
    yield b
    b.shutdown()
    assert len(loads) == 1  # the tokenizer, loaded at the first compilation, once


def _get(backend: XGrammarBackend, key: GrammarKey) -> Any:
    got = backend.get(key)
    return backend.resolve(key, got) if isinstance(got, Future) else got


def test_compiles_once_then_hits_the_cache(backend: XGrammarBackend, tok: Any) -> None:
    key = GrammarKey("regex", "(yes|no)")
    first = backend.get(key)
    assert isinstance(first, Future)
    assert backend.get(key) is first  # a second request waits on the same compilation
    a = backend.resolve(key, first)
    b = backend.get(key)  # cached: a fresh matcher at once
    assert not isinstance(a, InvalidGrammar | Future) and not isinstance(b, InvalidGrammar | Future)
    assert a is not b
    yes = tok.encode("yes", add_special_tokens=False)
    assert all(a.accept_token(t) for t in yes)
    assert not b.accept_token(tok.encode("maybe", add_special_tokens=False)[0])
    assert all(b.accept_token(t) for t in yes)  # b started at the beginning, not after a


def test_invalid_grammars_are_cached_with_the_reason(backend: XGrammarBackend) -> None:
    key = GrammarKey("ebnf", "root ::= undefined")
    result = _get(backend, key)
    assert isinstance(result, InvalidGrammar)
    assert result.message.startswith("ebnf: ") and "undefined" in result.message
    assert backend.get(key) == result  # no second compilation


def test_masks_open_rows_without_grammar(backend: XGrammarBackend) -> None:
    grammar = _get(backend, GrammarKey("json", '{"type": "integer"}'))
    mask = fill_vocab_masks([None, grammar, None], VOCAB)
    assert mask is not None and mask.shape == (3, VOCAB // 32) and mask.dtype == torch.int32
    assert bool((mask[0] == -1).all()) and bool((mask[2] == -1).all())
    assert not bool((mask[1] == -1).all())
    assert fill_vocab_masks([None, None], VOCAB) is None


def test_reasoner_grammar_constrains_only_after_think_end(
    backend: XGrammarBackend, tok: Any
) -> None:
    end_ids = tok.encode("</think>", add_special_tokens=False)
    grammar = ReasonerGrammar(_get(backend, GrammarKey("regex", "(yes|no)")), end_ids)
    for t in tok.encode("<think>anything at all, even yes", add_special_tokens=False):
        mask = fill_vocab_masks([grammar], VOCAB)
        assert mask is not None and bool((mask == -1).all())  # thinking: every token allowed
        assert grammar.accept_token(t)
    assert all(grammar.accept_token(t) for t in end_ids)
    mask = fill_vocab_masks([grammar], VOCAB)
    assert mask is not None and not bool((mask == -1).all())  # the answer is constrained
    assert not grammar.accept_token(tok.encode("maybe", add_special_tokens=False)[0])
    assert all(grammar.accept_token(t) for t in tok.encode("no", add_special_tokens=False))
    assert grammar.accept_token(tok.eos_token_id) and grammar.is_terminated()
