"""The load of `bench router-overhead`: chats at a fixed concurrency, and the CPU a process
tree spent on them.

The client is aiohttp (its C parser keeps the client's own cost small next to a router's):
each request is a pre-encoded chat body, plain or streamed; a request counts as ok when the
answer is a 200 and, for a stream, its last event is `data: [DONE]`. Latency is from sending
to the last byte, time to first byte from sending to the first body bytes.

CPU is read from /proc: user + system time of a process and all its descendants (every thread
included), so a router's threads and children count, whatever language it is written in.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from radixserve.bench.router_workload import words
from radixserve.bench.soak import tree_pids

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
DONE = b"data: [DONE]\n\n"


def tree_cpu_s(pid: int) -> tuple[float, float]:
    """User and system CPU seconds of `pid` and its live descendants (all their threads)."""
    user = system = 0
    for p in tree_pids(pid):
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        user += int(fields[11])  # utime and stime: fields 14 and 15 of /proc/<pid>/stat
        system += int(fields[12])
    return user / CLOCK_TICKS, system / CLOCK_TICKS


@dataclass(frozen=True)
class ChatLoad:
    """Chats of `tenants` tenants: each shares a system prompt of `system_words` words, and
    each chat asks its own question of `question_words` words."""

    tenants: int = 8
    system_words: int = 200
    question_words: int = 16
    max_tokens: int = 16
    model: str = "model"
    seed: int = 1

    def bodies(self, n: int, stream: bool) -> list[bytes]:
        rng = random.Random(self.seed)
        text = lambda k: " ".join(words(rng, k))  # noqa: E731
        systems = [text(self.system_words) for _ in range(self.tenants)]
        out = []
        for i in range(n):
            body = {
                "model": self.model,
                "messages": [
                    {"role": "system", "content": systems[i % self.tenants]},
                    {"role": "user", "content": text(self.question_words)},
                ],
                "max_tokens": self.max_tokens,
                "temperature": 0,
                "stream": stream,
            }
            out.append(json.dumps(body).encode())
        return out


@dataclass
class LoadResult:
    latencies_s: list[float] = field(default_factory=list)
    ttfb_s: list[float] = field(default_factory=list)
    failed: int = 0
    errors: set[str] = field(default_factory=set)
    duration_s: float = 0.0


async def _one(
    session: aiohttp.ClientSession, url: str, body: bytes, stream: bool, out: LoadResult
) -> None:
    headers = {"content-type": "application/json"}
    start = time.perf_counter()
    try:
        async with session.post(url, data=body, headers=headers) as resp:
            first = await resp.content.readany()
            ttfb = time.perf_counter() - start
            rest = await resp.read() if not resp.content.at_eof() else b""
            ok = resp.status == 200 and (not stream or (first + rest).endswith(DONE))
    except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
        out.failed += 1
        out.errors.add(f"{type(exc).__name__}: {exc}"[:200])
        return
    if not ok:
        out.failed += 1
        out.errors.add(f"HTTP {resp.status}: {(first + rest)[:200]!r}")
        return
    out.latencies_s.append(time.perf_counter() - start)
    out.ttfb_s.append(ttfb)


async def run_load(
    urls: Sequence[str], bodies: Sequence[bytes], concurrency: int, stream: bool
) -> LoadResult:
    """POST every body, round-robin over `urls`, at most `concurrency` in flight."""
    out = LoadResult()
    connector = aiohttp.TCPConnector(limit=concurrency, limit_per_host=concurrency)
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        queue = iter(enumerate(bodies))

        async def worker() -> None:
            for i, body in queue:
                await _one(session, urls[i % len(urls)], body, stream, out)

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        out.duration_s = time.perf_counter() - start
    return out


def percentile_ms(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    s = sorted(values)
    return 1000 * s[min(int(q / 100 * len(s)), len(s) - 1)]


def measure(
    pid: int | None, urls: Sequence[str], bodies: Sequence[bytes], concurrency: int, stream: bool
) -> dict[str, Any]:
    """One measured run; `pid` is the router's (None: the client talks to the engines)."""
    user0, sys0 = tree_cpu_s(pid) if pid else (0.0, 0.0)
    result = asyncio.run(run_load(urls, bodies, concurrency, stream))
    user1, sys1 = tree_cpu_s(pid) if pid else (0.0, 0.0)
    ok = len(result.latencies_s)
    per_req = lambda s: round(1000 * s / max(ok, 1), 3) if pid else None  # noqa: E731
    return {
        "ok": ok,
        "failed": result.failed,
        "cpu_ms_per_req": per_req(user1 - user0 + sys1 - sys0),
        "user_ms_per_req": per_req(user1 - user0),
        "sys_ms_per_req": per_req(sys1 - sys0),
        "req_per_s": round(ok / result.duration_s, 1),
        "p50_ms": round(percentile_ms(result.latencies_s, 50), 2),
        "p99_ms": round(percentile_ms(result.latencies_s, 99), 2),
        "ttfb_p50_ms": round(percentile_ms(result.ttfb_s, 50), 2),
        "errors": sorted(result.errors)[:3],
    }
