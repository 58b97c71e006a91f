"""TokenizerManager (main process, asyncio): sends validated requests to the scheduler and turns
the detokenizer's deltas back into per-request streams of `GenerateChunk`s.

It trusts its input (the edge — HTTP routes or the offline Engine — validated it into a
`GenerateInput`) and knows nothing of HTTP. Each request gets a ReqState with an asyncio.Queue;
one background task (`handle_loop`) receives every output and routes it. Per chunk the work is
proportional to the chunk: chunks carry deltas, and no cumulative list is kept here.

Failure modes: a consumer that stops listening (client gone) aborts its request, so the
scheduler frees its KV. If `handle_loop` dies, every waiting request fails at once with
`OutputLoopDied` and `on_fatal` is called (the server exits 1, as when a child process dies).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass
from typing import Any

import msgspec
import zmq.asyncio

from radixserve.engine.ipc.channels import AsyncPullChannel, PortArgs
from radixserve.engine.ipc.finish_reason import FinishAbort, FinishMatchedStr
from radixserve.engine.ipc.messages import (
    AbortReq,
    BatchStrOutput,
    ExpertDistributionOutput,
    ExpertDistributionReq,
    FinishReq,
    FlushCacheOutput,
    FlushCacheReq,
    GetLoadReq,
    GetStateReq,
    LoadOutput,
    StateOutput,
    TokenizerInput,
)
from radixserve.engine.tokenizer.data_parallel_controller import DataParallelController
from radixserve.engine.tokenizer.io_struct import GenerateChunk, GenerateInput, OutputLoopDied
from radixserve.engine.tokenizer.metrics import EngineMetrics, FinishedCounts
from radixserve.engine.tokenizer.request_log import (
    FinishedRequest,
    RequestLogOptions,
    log_finished,
    show_request_lines,
)
from radixserve.logging_setup import REQUEST_ID

logger = logging.getLogger(__name__)

CONTROL_TIMEOUT_S = 30.0


@dataclass(slots=True)
class ReqState:
    queue: asyncio.Queue[GenerateChunk | OutputLoopDied]
    created: float
    first_token_time: float | None = None
    last_token_time: float | None = None
    finished: bool = False
    last_chunk: GenerateChunk | None = None  # kept only for --log-requests
    request_id: str | None = None  # the HTTP request's id (X-Request-ID), for --log-requests
    queue_time: float | None = None  # observed once, from the first output that carries it
    prompt_text: str | None = None  # kept only for --log-requests-text
    output_parts: list[str] | None = None
    dp_rank: int = 0  # the DP rank serving it (its metrics' label)


class TokenizerManager:
    def __init__(
        self,
        tokenizer: Any,
        ports: PortArgs,
        metrics: EngineMetrics,
        on_fatal: Callable[[BaseException], None] | None = None,
        request_log: RequestLogOptions | None = None,
        *,
        dp_size: int = 1,
        load_balance_method: str = "round_robin",
    ) -> None:
        self.tokenizer = tokenizer
        self.request_log = request_log = request_log or RequestLogOptions()
        if request_log.enabled:
            show_request_lines()
        self.ports = ports
        self.metrics = metrics
        self.on_fatal = on_fatal
        self.rid_to_state: dict[str, ReqState] = {}
        self.waiters: dict[type, deque[asyncio.Future[Any]]] = {
            FlushCacheOutput: deque(),
            LoadOutput: deque(),
            StateOutput: deque(),
            ExpertDistributionOutput: deque(),
        }
        self.dead: BaseException | None = None
        self.dp_size, self.load_balance_method = dp_size, load_balance_method
        self._task: asyncio.Task[None] | None = None
        self._sends: set[asyncio.Task[None]] = set()  # aborts and finishes being sent

    async def start(self) -> None:
        self.ctx = ctx = zmq.asyncio.Context()
        # one push channel per DP rank, and where each request goes
        self.to_scheduler = DataParallelController(
            ctx, self.ports, self.dp_size, self.load_balance_method
        )
        self.recv = AsyncPullChannel(
            ctx, self.ports.tokenizer_input, bind=True, msg_type=TokenizerInput
        )
        self._task = asyncio.create_task(self.handle_loop(), name="tokenizer-manager-output")
        self._task.add_done_callback(self._on_loop_done)

    async def stop(self) -> None:
        """Cancel the output loop and close the sockets now: a context left to the garbage
        collector blocks in zmq_ctx_term while its sockets are open."""
        if self._task is not None:
            task, self._task = self._task, None
            task.cancel()
            self.ctx.destroy(linger=0)

    def tokenize(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text))

    # ---- request flow -----------------------------------------------------------------------

    async def generate(self, inp: GenerateInput) -> AsyncIterator[GenerateChunk]:
        """Yield the request's chunks until it finishes. Leaving the iterator early (client
        gone, task cancelled) aborts the request in the scheduler."""
        if self.dead is not None:
            raise OutputLoopDied("the output loop is dead") from self.dead
        state = ReqState(asyncio.Queue(), time.monotonic())
        if self.request_log.enabled:
            state.request_id = REQUEST_ID.get()  # this task serves the HTTP request
        if self.request_log.with_text:
            state.prompt_text, state.output_parts = inp.text, []
        self.rid_to_state[inp.rid] = state
        try:
            msg = inp.tokenized(self.tokenizer.eos_token_id)
            state.dp_rank = await self.to_scheduler.send_generate(msg)
            while True:
                item = await state.queue.get()
                if isinstance(item, OutputLoopDied):
                    raise item
                yield item
                if state.finished:
                    return
        finally:
            self.rid_to_state.pop(inp.rid, None)
            if not state.finished and self.dead is None:
                self.metrics.observe_client_abort(state.dp_rank)
                self._log_finished(inp.rid, state, "client_gone")
                self._abort_soon(inp.rid)  # releases the request's DP slot once sent
            else:
                self.to_scheduler.finished(inp.rid)

    def _abort_soon(self, rid: str) -> None:
        """Send the abort from a task of its own: the caller may be inside a cancelled scope
        (anyio cancels every await there), where an awaited send would never happen."""
        self._send_soon(self.abort(rid))

    def _send_soon(self, send: Coroutine[Any, Any, None]) -> None:
        """Run a send to the scheduler as a task (kept referenced until it is done)."""
        task = asyncio.get_running_loop().create_task(send)
        self._sends.add(task)
        task.add_done_callback(self._sends.discard)

    async def abort(self, rid: str) -> None:
        await self.to_scheduler.send_abort(AbortReq(rid=rid))
        self.to_scheduler.finished(rid)

    async def _control(self, msg: msgspec.Struct, reply: type) -> list[Any]:
        """Send a control request to every DP rank; one reply per rank."""
        if self.dead is not None:
            raise OutputLoopDied("the output loop is dead") from self.dead
        loop = asyncio.get_running_loop()
        futs: list[asyncio.Future[Any]] = [loop.create_future() for _ in range(self.dp_size)]
        self.waiters[reply].extend(futs)
        await self.to_scheduler.broadcast(msg)
        return list(await asyncio.wait_for(asyncio.gather(*futs), timeout=CONTROL_TIMEOUT_S))

    async def flush_cache(self) -> FlushCacheOutput:
        """Flush every DP rank's cache; fails (with the first rank's reason) if any refused."""
        outs: list[FlushCacheOutput] = await self._control(FlushCacheReq(), FlushCacheOutput)
        failed = [o for o in outs if not o.success]
        return failed[0] if failed else outs[0]

    async def expert_distribution(self, action: str) -> ExpertDistributionOutput:
        """start | stop | dump on every DP rank. A dump's counts: one rank's when the MoE ran
        over every DP rank's tokens (DP attention), else each rank's passes one after another."""
        req = ExpertDistributionReq(action)
        outs: list[ExpertDistributionOutput] = await self._control(req, ExpertDistributionOutput)
        failed = [o for o in outs if not o.success]
        if failed or outs[0].whole_model or len(outs) == 1:
            return failed[0] if failed else outs[0]
        passes = [p for o in outs for p in o.counts]
        physical = [p for o in outs for p in o.physical_counts]
        return ExpertDistributionOutput(
            True,
            "; ".join(o.message for o in outs),
            passes,
            physical_counts=physical,
            physical_to_logical_map=outs[0].physical_to_logical_map,  # DP group 0's placement
        )

    async def get_load(self) -> list[LoadOutput]:
        """One LoadOutput per DP rank, by dp_rank."""
        outs: list[LoadOutput] = await self._control(GetLoadReq(), LoadOutput)
        return sorted(outs, key=lambda o: o.dp_rank)

    async def get_state(self, include_pages: bool = False) -> list[StateOutput]:
        """One StateOutput per DP rank, by dp_rank."""
        outs: list[StateOutput] = await self._control(GetStateReq(include_pages), StateOutput)
        return sorted(outs, key=lambda o: o.dp_rank)

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

    def _on_loop_done(self, task: asyncio.Task[None]) -> None:
        """A loop that ends other than by `stop()` is fatal: fail every waiter, then say so."""
        if task.cancelled():
            return
        exc = task.exception() or RuntimeError("the output loop returned")
        self.dead = exc
        logger.critical("tokenizer manager output loop died", exc_info=exc)
        died = OutputLoopDied(f"the output loop died: {type(exc).__name__}: {exc}")
        for state in self.rid_to_state.values():
            state.queue.put_nowait(died)
        for waiters in self.waiters.values():
            while waiters:
                fut = waiters.popleft()
                if not fut.done():
                    fut.set_exception(died)
        if self.on_fatal is not None:
            self.on_fatal(exc)

    def _handle_batch(self, out: BatchStrOutput) -> None:
        now = time.monotonic()
        for i, rid in enumerate(out.rids):
            state = self.rid_to_state.get(rid)
            if state is None:
                continue  # aborted and forgotten
            new_ids = out.new_output_ids[i]
            if state.queue_time is None and out.queue_times:
                self._observe_queue_time(state, out.queue_times[i])
            self._observe_tokens(state, len(new_ids), now)
            finish = out.finished_reasons[i]
            chunk = GenerateChunk(
                rid=rid,
                text_delta=out.text_deltas[i],
                output_ids=new_ids,
                finish_reason=finish,
                prompt_tokens=out.prompt_tokens[i],
                completion_tokens=out.completion_tokens[i],
                cached_tokens=out.cached_tokens[i],
                total_retractions=out.retractions[i],
                token_logprobs=out.output_token_logprobs[i] if out.output_token_logprobs else [],
                top_logprobs=out.output_top_logprobs[i] if out.output_top_logprobs else [],
                input_logprobs=out.input_logprobs[i] if out.input_logprobs else None,
                e2e_latency=None if finish is None else now - state.created,
                spec_verify_ct=out.spec_verify_ct[i] if out.spec_verify_ct else 0,
                spec_accepted_drafts=out.spec_accepted_drafts[i] if out.spec_accepted_drafts else 0,
            )
            if self.request_log.enabled:
                state.last_chunk = chunk
                if state.output_parts is not None:
                    state.output_parts.append(chunk.text_delta)
            if isinstance(finish, FinishMatchedStr):
                # The detokenizer ended it on a stop string; its scheduler still runs it.
                self._send_soon(self.to_scheduler.send_to(state.dp_rank, FinishReq(rid, finish)))
            if finish is not None:
                state.finished = True
                self._log_finished(rid, state, finish.to_json()["type"])
                self.metrics.observe_finished(
                    FinishedCounts(
                        chunk.prompt_tokens,
                        chunk.completion_tokens,
                        chunk.cached_tokens,
                        chunk.total_retractions,
                        isinstance(finish, FinishAbort),
                        now - state.created,
                    ),
                    state.dp_rank,
                )
            state.queue.put_nowait(chunk)

    def _log_finished(self, rid: str, state: ReqState, reason: str) -> None:
        if not self.request_log.enabled:
            return
        first, last = state.first_token_time, state.last_chunk
        log_finished(
            FinishedRequest(
                rid=rid,
                request_id=state.request_id or rid,
                prompt_tokens=last.prompt_tokens if last else 0,
                completion_tokens=last.completion_tokens if last else 0,
                cached_tokens=last.cached_tokens if last else 0,
                ttft_s=None if first is None else first - state.created,
                e2e_s=time.monotonic() - state.created,
                queue_time_s=state.queue_time,
                finish_reason=reason,
                prompt_text=state.prompt_text,
                output_text=None if state.output_parts is None else "".join(state.output_parts),
            ),
            self.request_log,
        )

    def _observe_queue_time(self, state: ReqState, seconds: float | None) -> None:
        if seconds is not None:
            state.queue_time = seconds
            self.metrics.observe_queue_time(seconds, state.dp_rank)

    def _observe_tokens(self, state: ReqState, num_new: int, now: float) -> None:
        self.metrics.observe_tokens(num_new)
        if not num_new:
            return
        if state.first_token_time is None:
            state.first_token_time = now
            self.metrics.observe_ttft(now - state.created, state.dp_rank)
        elif state.last_token_time is not None:
            self.metrics.observe_itl((now - state.last_token_time) / num_new, state.dp_rank)
        state.last_token_time = now
