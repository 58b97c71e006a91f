"""Running a call's validated inputs, shared by the native and OpenAI routes and the offline
engines: `collect` (non-stream), `stream_chunks` (stream), their client-disconnect handling,
`sse` framing, `GenerateOutput` (one request's chunks appended, each costing what it holds) and
`native_output`, the one formatter of SGLang's native output. The native stream repeats the
cumulative text and ids in every event, as SGLang's wire format does; OpenAI streams send deltas.

Abort on disconnect is one mechanism for every route: the work runs in tasks; a client that
leaves cancels them, and `TokenizerManager.generate`'s cleanup aborts each unfinished request
in the scheduler (its KV is freed, it leaves the load). Non-stream calls watch the connection
(`until_disconnect`); a stream notices when Starlette cancels its body on disconnect.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from fastapi import Request
from fastapi.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from radixserve.engine.ipc.finish_reason import FinishReason
from radixserve.engine.ipc.messages import InputLogprobs
from radixserve.engine.tokenizer.io_struct import GenerateChunk, GenerateInput
from radixserve.engine.tokenizer.tokenizer_manager import TokenizerManager
from radixserve.protocol.http_edge import SSE_DONE

T = TypeVar("T")

DISCONNECT_POLL_S = 0.5
DONE = SSE_DONE


@dataclass(slots=True)
class GenerateOutput:
    """Everything one request produced so far; `add` costs what the chunk holds."""

    rid: str = ""
    text_parts: list[str] = field(default_factory=list)
    output_ids: list[int] = field(default_factory=list)
    token_logprobs: list[float] = field(default_factory=list)
    top_logprobs: list[list[tuple[float, int]]] = field(default_factory=list)
    input_logprobs: InputLogprobs | None = None  # the prompt's, once they came
    last: GenerateChunk | None = None

    def add(self, chunk: GenerateChunk) -> None:
        self.rid = chunk.rid
        self.text_parts.append(chunk.text_delta)
        self.output_ids += chunk.output_ids
        self.token_logprobs += chunk.token_logprobs
        self.top_logprobs += chunk.top_logprobs
        if chunk.input_logprobs is not None:
            self.input_logprobs = chunk.input_logprobs
        self.last = chunk

    @property
    def text(self) -> str:
        if len(self.text_parts) > 1:  # joined once, then kept joined
            self.text_parts[:] = ["".join(self.text_parts)]
        return self.text_parts[0] if self.text_parts else ""

    @property
    def finish_reason(self) -> FinishReason | None:
        return None if self.last is None else self.last.finish_reason

    def meta_info(self) -> dict[str, Any]:
        last = self.last
        assert last is not None, "meta_info of a request that produced no chunk"
        reason = last.finish_reason
        meta: dict[str, Any] = {
            "id": self.rid,
            "finish_reason": None if reason is None else reason.to_json(),
            "prompt_tokens": last.prompt_tokens,
            "completion_tokens": last.completion_tokens,
            "cached_tokens": last.cached_tokens,
            "total_retractions": last.total_retractions,
        }
        if last.e2e_latency is not None:
            meta["e2e_latency"] = last.e2e_latency
        if last.spec_verify_ct:  # SGLang's fields: tokens per verify include its bonus token
            meta["spec_verify_ct"] = last.spec_verify_ct
            meta["spec_num_correct_drafts"] = last.spec_accepted_drafts
            meta["spec_accept_length"] = (
                last.spec_accepted_drafts + last.spec_verify_ct
            ) / last.spec_verify_ct
        return meta


def native_output(out: GenerateOutput, return_logprob: bool) -> dict[str, Any]:
    """SGLang's native output object (logprobs as [logprob, token id, None] triples)."""
    meta = out.meta_info()
    if return_logprob:
        meta["output_token_logprobs"] = [
            [lp, t, None] for lp, t in zip(out.token_logprobs, out.output_ids, strict=False)
        ]
        if out.top_logprobs:
            meta["output_top_logprobs"] = [
                [[lp, t, None] for lp, t in row] for row in out.top_logprobs
            ]
        if out.input_logprobs is not None:
            meta.update(native_input_logprobs(out.input_logprobs))
    return {"text": out.text, "output_ids": list(out.output_ids), "meta_info": meta}


def native_input_logprobs(prompt: InputLogprobs) -> dict[str, Any]:
    """SGLang's `input_token_logprobs` (and `input_top_logprobs` where asked): a triple per
    prompt token from logprob_start_len on; the first prompt token's log-probability (and
    top list) is None, as it has no context."""
    fields: dict[str, Any] = {
        "input_token_logprobs": [
            [lp, t, None] for lp, t in zip(prompt.token_logprobs, prompt.token_ids, strict=True)
        ]
    }
    if prompt.top_logprobs:
        fields["input_top_logprobs"] = [
            None if lp is None else [[v, t, None] for v, t in row]
            for lp, row in zip(prompt.token_logprobs, prompt.top_logprobs, strict=True)
        ]
    return fields


def sse(payload: Any) -> bytes:
    """One server-sent event carrying `payload` as JSON."""
    return f"data: {json.dumps(payload)}\n\n".encode()


async def collect(tm: TokenizerManager, inputs: list[GenerateInput]) -> list[GenerateOutput]:
    """Run all inputs concurrently; return each one's accumulated output, in order."""

    async def one(inp: GenerateInput) -> GenerateOutput:
        out = GenerateOutput()
        async for chunk in tm.generate(inp):
            out.add(chunk)
        return out

    tasks = [asyncio.create_task(one(i)) for i in inputs]
    try:
        return list(await asyncio.gather(*tasks))
    finally:
        await _cancel_all(tasks)  # one failed (or we were cancelled): abort the others


class SSEResponse(StreamingResponse):
    """A text/event-stream response that closes its body generator when it ends.

    Starlette cancels the task that iterates the body when the client disconnects, which leaves
    the generator suspended at its `yield`: its `finally` (which aborts the requests) would then
    run only when the garbage collector finalizes it, at a time that depends on the event loop
    (uvloop and asyncio differ). Closing it here aborts them at once, on every loop."""

    def __init__(self, events: AsyncGenerator[bytes, None]) -> None:
        super().__init__(events, media_type="text/event-stream")
        self._events = events

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self._events.aclose()


async def stream_chunks(
    tm: TokenizerManager, inputs: list[GenerateInput]
) -> AsyncGenerator[tuple[int, GenerateChunk], None]:
    """Chunks of all inputs as they arrive, tagged with the input's index. Closing the
    iterator early (client gone) aborts every unfinished request."""
    queue: asyncio.Queue[tuple[int, GenerateChunk | None | BaseException]] = asyncio.Queue()

    async def pump(i: int, inp: GenerateInput) -> None:
        try:
            async for chunk in tm.generate(inp):
                await queue.put((i, chunk))
        except Exception as exc:  # handed to the consumer, raised there
            await queue.put((i, exc))
        finally:
            await queue.put((i, None))

    tasks = [asyncio.create_task(pump(i, inp)) for i, inp in enumerate(inputs)]
    remaining = len(tasks)
    try:
        while remaining:
            i, item = await queue.get()
            if item is None:
                remaining -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield i, item
    finally:
        await _cancel_all(tasks)


async def _cancel_all(tasks: list[asyncio.Task[Any]]) -> None:
    for t in tasks:
        t.cancel()
    for t in tasks:
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await t


async def until_disconnect(request: Request, work: Callable[[], Awaitable[T]]) -> T:
    """Await work(); if the client disconnects first, cancel it (which aborts its requests)."""
    task = asyncio.ensure_future(work())
    try:
        while not task.done():
            done, _ = await asyncio.wait({task}, timeout=DISCONNECT_POLL_S)
            if not done and await request.is_disconnected():
                raise asyncio.CancelledError("client disconnected")
        return task.result()
    finally:
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
