"""Request fan-out shared by the native and OpenAI routes: expand prompts × n into
GenerateInputs, run them concurrently, and stream or collect their chunks.

A disconnected client cancels its generators, which abort their requests in the scheduler.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from fastapi import Request

from radixserve.engine.managers.tokenizer_manager import GenerateInput, TokenizerManager


def expand_n(inputs: list[GenerateInput]) -> list[GenerateInput]:
    """n > 1 becomes n inputs; with a seed, sample i uses seed + i (distinct, reproducible)."""
    out = []
    for inp in inputs:
        params = dict(inp.sampling_params)
        n = int(params.pop("n", 1) or 1)
        if n < 1:
            raise ValueError(f"n: must be ≥ 1, got {n}")
        seed = params.get("sampling_seed")
        for i in range(n):
            p = dict(params)
            if seed is not None:
                p["sampling_seed"] = int(seed) + i
            out.append(
                GenerateInput(
                    inp.input_ids, p, inp.text, inp.stream, inp.return_logprob, inp.top_logprobs_num
                )
            )
    return out


async def collect(tm: TokenizerManager, inputs: list[GenerateInput]) -> list[dict[str, Any]]:
    """Run all inputs concurrently; return each one's final chunk, in order."""
    for inp in inputs:
        tm.validate(inp)  # reject the whole call before anything is scheduled

    async def last(inp: GenerateInput) -> dict[str, Any]:
        final: dict[str, Any] = {}
        async for chunk in tm.generate(inp):
            final = chunk
        return final

    return list(await asyncio.gather(*(last(i) for i in inputs)))


async def merge_streams(
    tm: TokenizerManager, inputs: list[GenerateInput]
) -> AsyncIterator[tuple[int, dict[str, Any]]]:
    """Chunks of all inputs as they arrive, tagged with the input's index."""
    for inp in inputs:
        tm.validate(inp)
    queue: asyncio.Queue[tuple[int, dict[str, Any] | None]] = asyncio.Queue()

    async def pump(i: int, inp: GenerateInput) -> None:
        try:
            async for chunk in tm.generate(inp):
                await queue.put((i, chunk))
        finally:
            await queue.put((i, None))

    tasks = [asyncio.create_task(pump(i, inp)) for i, inp in enumerate(inputs)]
    remaining = len(tasks)
    try:
        while remaining:
            i, chunk = await queue.get()
            if chunk is None:
                remaining -= 1
            else:
                yield i, chunk
    finally:
        for t in tasks:
            t.cancel()  # client gone: the generators' cleanup aborts unfinished requests
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t


async def until_disconnect(request: Request, work: Callable[[], Awaitable[Any]]) -> Any:
    """Await work(); if the client disconnects first, cancel it (which aborts its requests)."""
    task = asyncio.create_task(work())
    while not task.done():
        done, _ = await asyncio.wait({task}, timeout=0.5)
        if not done and await request.is_disconnected():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            raise asyncio.CancelledError("client disconnected")
    return task.result()
