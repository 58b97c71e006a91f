"""GrammarQueue: requests whose grammar is still compiling (SGLang's grammar queue), and the
token bitmask of a launched batch that waits for its grammars to catch up.

A constrained request enters the waiting queue only once its grammar is ready: a cache hit at
once, otherwise after the backend's worker thread compiled it (polled every round, never
waited on while other work runs), so one slow schema does not stall the batch. A grammar that
fails to compile, or takes longer than GRAMMAR_TIMEOUT_S, ends its request with a 400.

Under tensor parallelism every rank compiles on its own; rank 0 of the ranks that schedule
together decides which requests are ready and broadcasts that, and the others wait for their
own compilation of exactly those, so all ranks admit the same requests in the same round.
Runs in the scheduler process, on the scheduler thread.
"""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass

import msgspec
import torch

from radixserve.engine.constrained import (
    BaseGrammarBackend,
    BaseGrammarObject,
    CompileResult,
    GrammarKey,
    InvalidGrammar,
    ReasonerGrammar,
    fill_vocab_masks,
)
from radixserve.engine.distributed import GroupHandle
from radixserve.engine.ipc.finish_reason import FinishAbort, FinishReason
from radixserve.engine.scheduler.req import Req

GRAMMAR_POLL_S = 0.005  # how long an otherwise idle round waits for a compilation
GRAMMAR_TIMEOUT_S = 120.0  # a grammar still compiling after this fails its request
NO_BACKEND = FinishAbort(
    "json_schema / regex / ebnf / structural_tag need a grammar backend; this server runs "
    "with --grammar-backend none",
    400,
)


@dataclass(slots=True)
class _Waiting:
    req: Req
    key: GrammarKey
    future: Future[CompileResult]
    since: float


class _Decision(msgspec.Struct, frozen=True):
    """Rank 0's verdict on the waiting list, by position (the same on every rank)."""

    ready: list[int]
    failed: list[int]


@dataclass(slots=True)
class PendingMask:
    """A launched batch's token bitmask, filled once its grammars have accepted every earlier
    token (overlap: after the previous batch's results were processed)."""

    future: Future[torch.Tensor | None]
    grammars: list[BaseGrammarObject | None]
    vocab_size: int

    def fill(self) -> None:
        if not self.future.done():
            self.future.set_result(fill_vocab_masks(self.grammars, self.vocab_size))


class GrammarQueue:
    def __init__(self, backend: BaseGrammarBackend | None, cpu: GroupHandle) -> None:
        self.backend = backend
        self.cpu = cpu  # the CPU group of the ranks that schedule together
        self.waiting: list[_Waiting] = []
        self._decoder = msgspec.msgpack.Decoder(_Decision)

    def __len__(self) -> int:
        return len(self.waiting)

    def admit(self, req: Req) -> bool:
        """Give `req` its grammar. True: it waits here for the compilation. False: it may be
        scheduled (grammar set, or none needed), or it is finished (a 400 abort reason)."""
        key = req.grammar_key
        if key is None:
            return False
        if self.backend is None:
            req.finished_reason = NO_BACKEND
            return False
        got = self.backend.get(key)
        if isinstance(got, Future):
            self.waiting.append(_Waiting(req, key, got, time.monotonic()))
            return True
        _assign(req, got, self.backend.think_end_ids)
        return False

    def take_ready(self, wait_s: float = 0.0) -> list[Req]:
        """Requests whose grammar is now set, or which are finished because it failed; waits
        up to `wait_s` for a compilation to end when none has."""
        if not self.waiting:
            return []
        decision = self._agree(lambda: self._decide(wait_s))
        assert self.backend is not None, "requests wait only when there is a backend"
        out = []
        for i in decision.ready:
            w = self.waiting[i]
            _assign(w.req, self.backend.resolve(w.key, w.future), self.backend.think_end_ids)
            out.append(w.req)
        for i in decision.failed:
            w = self.waiting[i]
            message = f"the grammar took longer than {GRAMMAR_TIMEOUT_S:g} s to compile"
            _assign(w.req, self.backend.fail(w.key, w.future, message), [])
            out.append(w.req)
        taken = set(decision.ready) | set(decision.failed)
        self.waiting = [w for i, w in enumerate(self.waiting) if i not in taken]
        return out

    def abort(self, hit: Callable[[Req], bool], reason: FinishReason) -> list[Req]:
        """End the waiting requests `hit` selects (their compilation goes on, for the cache)."""
        aborted = [w.req for w in self.waiting if hit(w.req)]
        self.waiting = [w for w in self.waiting if not hit(w.req)]
        for req in aborted:
            req.finished_reason = reason
        return aborted

    def _decide(self, wait_s: float) -> _Decision:
        futures = [w.future for w in self.waiting]
        if wait_s > 0 and not any(f.done() for f in futures):
            concurrent.futures.wait(futures, wait_s, concurrent.futures.FIRST_COMPLETED)
        now = time.monotonic()
        ready = [i for i, w in enumerate(self.waiting) if w.future.done()]
        failed = [
            i
            for i, w in enumerate(self.waiting)
            if not w.future.done() and now - w.since > GRAMMAR_TIMEOUT_S
        ]
        return _Decision(ready, failed)

    def _agree(self, decide: Callable[[], _Decision]) -> _Decision:
        """Rank 0's decision on every rank; the others first finish those compilations."""
        if self.cpu.size == 1:
            return decide()
        if self.cpu.is_first:
            decision = decide()
            self.cpu.broadcast_bytes(msgspec.msgpack.encode(decision))
            return decision
        decision = self._decoder.decode(self.cpu.broadcast_bytes(None))
        for i in decision.ready:
            self.waiting[i].future.result()  # the same grammar compiles here too
        return decision


def _assign(req: Req, result: CompileResult, think_end_ids: list[int]) -> None:
    if isinstance(result, InvalidGrammar):
        req.finished_reason = FinishAbort(result.message, 400)
    elif req.require_reasoning and think_end_ids:
        req.grammar = ReasonerGrammar(result, think_end_ids)
    else:
        req.grammar = result
