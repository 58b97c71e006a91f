"""The grammar-backend interface: per-request grammar state, and compilation off the hot loop.

`GrammarKey` names what a request constrains its output to (a JSON schema, a regex, an EBNF
grammar, a structural tag). A `BaseGrammarBackend` compiles keys on a worker thread (SGLang's
grammar queue: one slow schema never stalls the scheduler's loop) and caches the result per key,
invalid ones too, so a repeated bad grammar fails at once. A `BaseGrammarObject` is one request's
matcher over a compiled grammar: it fills the request's row of the token bitmask, accepts each
sampled token and says when the grammar has terminated. Runs in the scheduler process; the
scheduler thread alone touches the cache and the objects, the worker thread only compiles.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Literal

import torch

logger = logging.getLogger(__name__)

GrammarKind = Literal["json", "regex", "ebnf", "structural_tag"]
CACHE_SIZE = 1024  # compiled grammars kept (least recently used dropped first)
# The request field each kind comes from (the message of a grammar that fails to compile).
FIELD_OF_KIND: dict[GrammarKind, str] = {
    "json": "json_schema",
    "regex": "regex",
    "ebnf": "ebnf",
    "structural_tag": "structural_tag",
}


@dataclass(frozen=True, slots=True)
class GrammarKey:
    """What one request's output must match: the kind and its source text."""

    kind: GrammarKind
    text: str

    @property
    def field(self) -> str:
        return FIELD_OF_KIND[self.kind]


@dataclass(frozen=True, slots=True)
class InvalidGrammar:
    """A grammar that did not compile; the message says why (shown to the client)."""

    message: str


class BaseGrammarObject(ABC):
    """One request's position in its grammar. Not thread-safe: the scheduler thread's."""

    @abstractmethod
    def accept_token(self, token_id: int) -> bool:
        """Advance past `token_id`; False (state unchanged) when the grammar forbids it."""

    @abstractmethod
    def fill_vocab_mask(self, mask: torch.Tensor, row: int) -> None:
        """Write the allowed next tokens into row `row` of `mask` ([B, ceil(V/32)] int32, CPU;
        bit j of word w set = token 32·w + j allowed)."""

    @abstractmethod
    def is_terminated(self) -> bool:
        """Whether the grammar has accepted a stop token: nothing may follow."""

    @abstractmethod
    def copy(self) -> BaseGrammarObject:
        """A fresh state at the start of the same compiled grammar (for another request)."""

    def allows_no_token(self, vocab_size: int) -> bool:
        """Whether no id below `vocab_size` may come next: a grammar that needs text the model's
        vocabulary cannot spell (such as a lone surrogate in a schema's key) ends up here."""
        mask = torch.zeros((1, (vocab_size + 31) // 32), dtype=torch.int32)
        self.fill_vocab_mask(mask, 0)
        return not bool(mask.any())


CompileResult = BaseGrammarObject | InvalidGrammar


class BaseGrammarBackend(ABC):
    """Compiles grammar keys on one worker thread and caches the results by key."""

    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = vocab_size  # the logits' width: the mask has ceil(vocab_size/32) words
        self.think_end_ids: list[int] = []  # --reasoning-parser: the ids of "</think>"
        self._executor: ThreadPoolExecutor | None = None
        self._cache: OrderedDict[GrammarKey, CompileResult] = OrderedDict()
        self._compiling: dict[GrammarKey, Future[CompileResult]] = {}

    @abstractmethod
    def compile(self, key: GrammarKey) -> BaseGrammarObject:
        """Compile `key` (on the worker thread); ValueError with the reason when invalid."""

    def get(self, key: GrammarKey) -> CompileResult | Future[CompileResult]:
        """The cached result (a fresh copy of a grammar), or the future of its compilation.

        A future is shared by every request waiting on the same key; `resolve` turns its
        result into each one's own copy."""
        hit = self._cache.get(key)
        if hit is not None:
            self._cache.move_to_end(key)
            return hit if isinstance(hit, InvalidGrammar) else hit.copy()
        fut = self._compiling.get(key)
        if fut is None:
            fut = self._pool().submit(self._compile_safely, key)
            self._compiling[key] = fut
        return fut

    def resolve(self, key: GrammarKey, fut: Future[CompileResult]) -> CompileResult:
        """A finished future's result, cached, as this request's own state."""
        result = fut.result()
        if self._compiling.get(key) is fut:
            del self._compiling[key]
            self._remember(key, result)
        return result if isinstance(result, InvalidGrammar) else result.copy()

    def fail(self, key: GrammarKey, fut: Future[CompileResult], message: str) -> InvalidGrammar:
        """Give up on a compilation (too slow): cancel it and remember the key as invalid."""
        fut.cancel()
        invalid = InvalidGrammar(message)
        if self._compiling.get(key) is fut:
            del self._compiling[key]
            self._remember(key, invalid)
        return invalid

    def reset(self) -> None:
        """Forget every compiled grammar (flush_cache)."""
        self._cache.clear()

    def shutdown(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None

    def _remember(self, key: GrammarKey, result: CompileResult) -> None:
        self._cache[key] = result
        while len(self._cache) > CACHE_SIZE:
            self._cache.popitem(last=False)

    def _pool(self) -> ThreadPoolExecutor:
        # Started on first use: constructors start no threads (style guide, rule 4).
        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="grammar-compile")
        return self._executor

    def _compile_safely(self, key: GrammarKey) -> CompileResult:
        try:
            return self.compile(key)
        except (ValueError, RuntimeError) as exc:  # the grammar's fault, not the server's
            logger.info("invalid %s: %s", key.field, exc)
            return InvalidGrammar(f"{key.field}: {error_reason(exc)}")


def error_reason(exc: BaseException) -> str:
    """xgrammar's message without its C++ source location ("[12:00:00] file.cc:94: ...")."""
    lines = [ln.strip() for ln in str(exc).strip().splitlines() if ln.strip()]
    text = lines[0] if lines else type(exc).__name__
    if text.startswith("["):
        text = text.split("] ", 1)[-1]
        head, sep, rest = text.partition(": ")
        text = rest if sep and ".cc:" in head else text
    return text


def fill_vocab_masks(
    grammars: list[BaseGrammarObject | None], vocab_size: int
) -> torch.Tensor | None:
    """The batch's token bitmask ([B, ceil(V/32)] int32, CPU), or None when no row has a live
    grammar. Rows without one (or whose grammar terminated) allow every token (all bits set)."""
    live = [(i, g) for i, g in enumerate(grammars) if g is not None and not g.is_terminated()]
    if not live:
        return None
    mask = torch.full((len(grammars), (vocab_size + 31) // 32), -1, dtype=torch.int32)
    for row, grammar in live:
        grammar.fill_vocab_mask(mask, row)
    return mask
