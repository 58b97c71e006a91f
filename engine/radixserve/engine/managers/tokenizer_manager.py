"""TokenizerManager (main process, asyncio): validates and tokenizes requests, sends them to
the scheduler, and turns the detokenizer's deltas back into per-request output streams.

Each request gets a ReqState with an asyncio.Queue of output chunks; a single background
task (`handle_loop`) receives every output and routes it. A consumer that stops listening
(client disconnect) aborts its request so its KV is freed.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import zmq.asyncio

from radixserve.engine.ipc.channels import AsyncPullChannel, AsyncPushChannel, PortArgs
from radixserve.engine.ipc.messages import (
    AbortReq,
    BatchStrOutput,
    FlushCacheOutput,
    FlushCacheReq,
    GetLoadReq,
    GetStateReq,
    LoadOutput,
    StateOutput,
    TokenizedGenerateReq,
    TokenizerInput,
)
from radixserve.engine.managers.metrics import EngineMetrics
from radixserve.engine.sampling import SamplingParams

logger = logging.getLogger(__name__)


class RequestError(ValueError):
    """Bad input: becomes HTTP 400 (or the given status) with this message."""

    def __init__(self, message: str, status_code: int = 400) -> None:
        super().__init__(message)
        self.status_code = status_code


@dataclass(slots=True)
class GenerateInput:
    """One prompt (already expanded: n > 1 becomes n GenerateInputs)."""

    input_ids: list[int]
    sampling_params: dict[str, Any]
    text: str | None = None
    stream: bool = False
    return_logprob: bool = False
    top_logprobs_num: int = 0
    rid: str = field(default_factory=lambda: uuid.uuid4().hex)


@dataclass(slots=True)
class ReqState:
    queue: asyncio.Queue[dict[str, Any]]
    created: float
    text: str = ""
    output_ids: list[int] = field(default_factory=list)
    token_logprobs: list[float] = field(default_factory=list)
    top_logprobs: list[Any] = field(default_factory=list)
    first_token_time: float | None = None
    last_token_time: float | None = None
    finished: bool = False


@dataclass(frozen=True, slots=True)
class ServerLimits:
    context_len: int
    max_req_input_len: int
    vocab_size: int


class TokenizerManager:
    def __init__(
        self, tokenizer: Any, ports: PortArgs, limits: ServerLimits, metrics: EngineMetrics
    ) -> None:
        self.tokenizer = tokenizer
        self.ports = ports
        self.limits = limits
        self.metrics = metrics
        self.rid_to_state: dict[str, ReqState] = {}
        self.waiters: dict[type, deque[asyncio.Future[Any]]] = {
            FlushCacheOutput: deque(),
            LoadOutput: deque(),
            StateOutput: deque(),
        }
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self.ctx = ctx = zmq.asyncio.Context()
        self.to_scheduler = AsyncPushChannel(ctx, self.ports.scheduler_input, bind=True)
        self.recv = AsyncPullChannel(
            ctx, self.ports.tokenizer_input, bind=True, msg_type=TokenizerInput
        )
        self._task = asyncio.create_task(self.handle_loop())

    async def stop(self) -> None:
        """Cancel the output loop and close the sockets now: a context left to the garbage
        collector blocks in zmq_ctx_term while its sockets are open."""
        if self._task is not None:
            self._task.cancel()
            self._task = None
            self.ctx.destroy(linger=0)

    # ---- validation -------------------------------------------------------------------------

    def tokenize(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text))

    def validate(self, inp: GenerateInput) -> None:
        """SGLang's checks: sampling ranges, prompt and prompt + max_new_tokens vs context."""
        try:
            params = SamplingParams.from_dict(inp.sampling_params)
            params.verify(self.limits.vocab_size)
            params.normalize()
        except ValueError as exc:
            raise RequestError(str(exc)) from None
        n, ctx = len(inp.input_ids), self.limits.context_len
        if n == 0:
            raise RequestError("The input is empty.")
        if any(not 0 <= t < self.limits.vocab_size for t in inp.input_ids):
            raise RequestError(f"input_ids: token ids must be in [0, {self.limits.vocab_size})")
        if n >= ctx or n > self.limits.max_req_input_len:
            raise RequestError(
                f"The input ({n} tokens) is longer than the model's context length ({ctx} tokens)."
            )
        if n + params.max_new_tokens >= ctx:
            raise RequestError(
                f"Requested token count exceeds the model's maximum context length of {ctx} "
                f"tokens. You requested a total of {n + params.max_new_tokens} tokens: {n} "
                f"tokens from the input messages and {params.max_new_tokens} tokens for the "
                "completion. Please reduce the number of tokens in the input messages or the "
                "completion to fit within the limit."
            )

    # ---- request flow -----------------------------------------------------------------------

    async def generate(self, inp: GenerateInput) -> AsyncIterator[dict[str, Any]]:
        """Yield output chunks (cumulative text, meta_info) until the request finishes.
        Leaving the iterator early (client gone) aborts the request."""
        self.validate(inp)
        state = ReqState(asyncio.Queue(), time.monotonic())
        self.rid_to_state[inp.rid] = state
        await self.to_scheduler.send(
            TokenizedGenerateReq(
                rid=inp.rid,
                input_ids=inp.input_ids,
                sampling_params=inp.sampling_params,
                input_text=inp.text,
                return_logprob=inp.return_logprob,
                top_logprobs_num=inp.top_logprobs_num,
                stream=inp.stream,
            )
        )
        try:
            while True:
                chunk = await state.queue.get()
                yield chunk
                if state.finished:
                    return
        finally:
            if not state.finished:
                self.metrics.observe_client_abort()
                await self.abort(inp.rid)
            self.rid_to_state.pop(inp.rid, None)

    async def abort(self, rid: str) -> None:
        await self.to_scheduler.send(AbortReq(rid=rid))

    async def _control(self, msg: Any, reply: type) -> Any:
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.waiters[reply].append(fut)
        await self.to_scheduler.send(msg)
        return await asyncio.wait_for(fut, timeout=30)

    async def flush_cache(self) -> FlushCacheOutput:
        return await self._control(FlushCacheReq(), FlushCacheOutput)

    async def get_load(self) -> LoadOutput:
        return await self._control(GetLoadReq(), LoadOutput)

    async def get_state(self, include_pages: bool = False) -> StateOutput:
        return await self._control(GetStateReq(include_pages), StateOutput)

    # ---- outputs ----------------------------------------------------------------------------

    async def handle_loop(self) -> None:
        while True:
            msg = await self.recv.recv()
            if isinstance(msg, BatchStrOutput):
                self._handle_batch(msg)
            else:
                waiters = self.waiters[type(msg)]
                if waiters:
                    fut = waiters.popleft()
                    if not fut.done():
                        fut.set_result(msg)

    def _handle_batch(self, out: BatchStrOutput) -> None:
        now = time.monotonic()
        for i, rid in enumerate(out.rids):
            state = self.rid_to_state.get(rid)
            if state is None:
                continue  # aborted and forgotten
            new_ids = out.new_output_ids[i]
            self.metrics.observe_tokens(len(new_ids))
            if new_ids:
                if state.first_token_time is None:
                    state.first_token_time = now
                    self.metrics.observe_ttft(now - state.created)
                elif state.last_token_time is not None:
                    self.metrics.observe_itl((now - state.last_token_time) / len(new_ids))
                state.last_token_time = now
            state.text += out.text_deltas[i]
            state.output_ids += new_ids
            if out.output_token_logprobs:
                state.token_logprobs += out.output_token_logprobs[i]
            if out.output_top_logprobs:
                state.top_logprobs += out.output_top_logprobs[i]
            finish = out.finished_reasons[i]
            meta = {
                "id": rid,
                "finish_reason": finish,
                "prompt_tokens": out.prompt_tokens[i],
                "completion_tokens": out.completion_tokens[i],
                "cached_tokens": out.cached_tokens[i],
                "total_retractions": out.retractions[i],
            }
            if finish is not None:
                state.finished = True
                meta["e2e_latency"] = now - state.created
                self.metrics.observe_finished(meta)
            state.queue.put_nowait(
                {
                    "text": state.text,
                    "delta": out.text_deltas[i],
                    "output_ids": list(state.output_ids),
                    "new_output_ids": new_ids,
                    "meta_info": meta,
                    "token_logprobs": list(state.token_logprobs),
                    "top_logprobs": list(state.top_logprobs),
                }
            )
