"""The router benchmark's traffic: tenants with shared prefixes, an arrival order, one client.

Each of `tenants` tenants has a prefix of `prefix_len` units (words for text prompts, token ids
for id prompts); each of its `per_tenant` requests appends a question of `question_len` units.
Arrival orders:
- `interleaved`: round i sends one request of every tenant, the tenant order rotated by i (so
  round-robin never pins a tenant by accident);
- `random`: all requests shuffled (seeded);
- `bursty`: every request of one tenant, then the next tenant's (tenants in a seeded order), so
  a tenant's requests are in flight together and none of its prefix is cached yet.
Text prompts go to `/generate` as `text` (every router can read them, sglang-router included);
the engines' `meta_info` gives prompt and cached tokens. With `api="openai"` they go to
`/v1/completions` (vLLM has no `/generate`), and cached tokens come from the engines' own
prefix-cache counters instead (`engine_counters`). Runs in the benchmark's process only.
"""

from __future__ import annotations

import asyncio
import random
import re
import time
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Literal

import httpx

from radixserve.bench.serving import StreamRefused, sse_chunks
from radixserve.logging_setup import progress_bar

ORDERS = ("interleaved", "random", "bursty")
APIS = ("native", "openai")
Order = Literal["interleaved", "random", "bursty"]
PromptForm = Literal["text", "ids"]
SESSION_HEADER = "x-session-id"
_SYLLABLES = tuple(c + v for c in "bdfgklmnprstvz" for v in "aeiou")


@dataclass(frozen=True, slots=True)
class TenantWorkload:
    tenants: int = 6
    per_tenant: int = 8
    prefix_len: int = 600
    question_len: int = 32
    output_len: int = 8
    order: Order = "interleaved"
    prompt_form: PromptForm = "text"
    seed: int = 1
    vocab_size: int = 49152


@dataclass(frozen=True, slots=True)
class TenantRequest:
    tenant: int
    prompt: str | list[int]
    output_len: int


@dataclass(slots=True)
class TenantResult:
    tenant: int
    ok: bool = False
    prompt_tokens: int = 0
    cached_tokens: int = 0
    ttft_s: float = 0.0
    latency_s: float = 0.0
    error: str = ""


def words(rng: random.Random, n: int) -> list[str]:
    """`n` made-up words of one to three syllables (text every tokenizer splits alike)."""
    return ["".join(rng.choices(_SYLLABLES, k=rng.randint(1, 3))) for _ in range(n)]


def _units(rng: random.Random, n: int, cfg: TenantWorkload) -> list[str] | list[int]:
    if cfg.prompt_form == "ids":  # skip low ids, where tokenizers keep special tokens
        return [rng.randrange(100, cfg.vocab_size) for _ in range(n)]
    return words(rng, n)


def _prompt(prefix: list[str] | list[int], question: list[str] | list[int]) -> str | list[int]:
    if prefix and isinstance(prefix[0], str):
        return " ".join(str(u) for u in [*prefix, *question])
    return [int(u) for u in [*prefix, *question]]


def build_requests(cfg: TenantWorkload) -> list[TenantRequest]:
    """Every tenant's requests, in the arrival order of `cfg.order`."""
    rng = random.Random(cfg.seed)
    by_tenant: list[list[TenantRequest]] = []
    for t in range(cfg.tenants):
        prefix = _units(rng, cfg.prefix_len, cfg)
        by_tenant.append(
            [
                TenantRequest(
                    t, _prompt(prefix, _units(rng, cfg.question_len, cfg)), cfg.output_len
                )
                for _ in range(cfg.per_tenant)
            ]
        )
    if cfg.order == "interleaved":
        n = cfg.tenants
        return [by_tenant[(k + i) % n][i] for i in range(cfg.per_tenant) for k in range(n)]
    if cfg.order == "bursty":
        tenants = list(range(cfg.tenants))
        rng.shuffle(tenants)
        return [r for t in tenants for r in by_tenant[t]]
    flat = [r for reqs in by_tenant for r in reqs]
    rng.shuffle(flat)
    return flat


def _body(req: TenantRequest, api: str) -> tuple[str, dict[str, Any]]:
    if api == "openai":  # prompt as text or ids; usage in the last chunk
        return "/v1/completions", {
            "prompt": req.prompt, "max_tokens": req.output_len, "temperature": 0,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True},
        }  # fmt: skip
    key = "text" if isinstance(req.prompt, str) else "input_ids"
    return "/generate", {
        key: req.prompt,
        "stream": True,
        "sampling_params": {"max_new_tokens": req.output_len, "temperature": 0, "ignore_eos": True},
    }


def _take(res: TenantResult, chunk: dict[str, Any]) -> None:
    """Prompt/cached tokens and success from one chunk of either API."""
    meta = chunk.get("meta_info") or chunk.get("usage") or {}
    res.prompt_tokens = int(meta.get("prompt_tokens") or res.prompt_tokens)
    details = meta.get("prompt_tokens_details") or {}
    res.cached_tokens = int(meta.get("cached_tokens") or details.get("cached_tokens") or 0)
    res.ok = res.ok or int(meta.get("completion_tokens") or 0) > 0


async def _send(
    client: httpx.AsyncClient, url: str, req: TenantRequest, pinned: bool, api: str = "native"
) -> TenantResult:
    path, body = _body(req, api)
    headers = {SESSION_HEADER: f"tenant-{req.tenant}"} if pinned else None
    res, start = TenantResult(req.tenant), time.perf_counter()
    try:
        async for chunk in sse_chunks(client, url + path, body, headers):
            res.ttft_s = res.ttft_s or time.perf_counter() - start
            _take(res, chunk)
        res.latency_s = time.perf_counter() - start
    except StreamRefused as exc:
        res.error = str(exc)
    except httpx.HTTPError as exc:
        res.error = f"{type(exc).__name__}: {exc}"
    return res


async def run_traffic(
    url: str, reqs: list[TenantRequest], concurrency: int, pinned: bool, api: str = "native"
) -> tuple[list[TenantResult], float]:
    """Send `reqs` in order with at most `concurrency` in flight; results and seconds taken."""
    limit = asyncio.Semaphore(concurrency)
    bar = progress_bar(len(reqs), "bench router", "req")  # stderr, only on a terminal
    async with httpx.AsyncClient(timeout=httpx.Timeout(900.0)) as client:

        async def one(req: TenantRequest) -> TenantResult:
            async with limit:
                res = await _send(client, url, req, pinned, api)
            bar.update()
            return res

        start = time.perf_counter()
        tasks = []
        for req in reqs:  # start in arrival order: each waits for a slot in that order
            tasks.append(asyncio.ensure_future(one(req)))
            await asyncio.sleep(0)
        results = await asyncio.gather(*tasks)
        bar.close()
        return list(results), time.perf_counter() - start


COUNTERS = MappingProxyType(
    {  # name in our table → the engines' counter (radixserve's, then vLLM's)
        "requests": ("radixserve:num_requests_total", "vllm:request_success_total"),
        "prompt": ("radixserve:prompt_tokens_total", "vllm:prefix_cache_queries_total"),
        "cached": ("radixserve:cached_tokens_total", "vllm:prefix_cache_hits_total"),
    }
)


def _counter(text: str, names: tuple[str, ...]) -> int:
    for name in names:
        values = re.findall(rf"^{re.escape(name)}(?:\{{[^}}]*\}})? ([0-9.e+]+)$", text, re.M)
        if values:
            return int(sum(float(v) for v in values))
    return 0


def engine_counters(urls: list[str]) -> list[dict[str, int]]:
    """Per engine: finished requests, prompt tokens and prefix-cache hits from its /metrics."""
    out = []
    for u in urls:
        text = httpx.get(u + "/metrics", timeout=10).text
        out.append({k: _counter(text, names) for k, names in COUNTERS.items()})
    return out
