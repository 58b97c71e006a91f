"""`radixserve bench serving`: SGLang's bench_serving against a live server: ours or any
server speaking SGLang's native /generate (`--backend radixserve`), or any OpenAI-compatible
server (`--backend openai`: streamed /v1/completions with token-id prompts, so vLLM and
radixserve see the same tokens and are measured by the same client).

Requests are streamed so TTFT and inter-token latencies are measured per chunk. With
`--json-schema` every answer is constrained to that schema (the cost of constrained decoding,
beside the same prompts without it): `response_format` on /v1/completions (SGLang and vLLM
take it there), `sampling_params.json_schema` on /generate; answers then end where the schema
does (no ignore_eos), and each is validated with jsonschema. Arrivals:
all at once (`--request-rate inf`) or Poisson at the given rate; `--max-concurrency` caps
requests in flight. The cache hit rate is Σ meta_info.cached_tokens / Σ prompt tokens.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx

from radixserve.bench.datasets import (
    BenchRequest,
    generated_shared_prefix,
    gsp_from_args,
    random_requests,
)
from radixserve.bench.report import print_table, write_json
from radixserve.bench.text_datasets import TEXT_DATASETS, text_requests
from radixserve.logging_setup import progress_bar


@dataclass(slots=True)
class RequestResult:
    ok: bool
    prompt_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0
    ttft: float = 0.0
    latency: float = 0.0
    itls: list[float] = field(default_factory=list)
    error: str = ""
    text: str = ""


def add_serving_parser(sub: Any) -> None:
    p = sub.add_parser("serving", help="online benchmark against a running server")
    p.add_argument("--base-url", default="http://127.0.0.1:30000")
    p.add_argument(
        "--backend",
        default="radixserve",
        choices=["radixserve", "openai"],
        help="radixserve: native /generate; openai: /v1/completions (vLLM, SGLang, us)",
    )
    p.add_argument(
        "--model",
        default=None,
        help="model name for --backend openai (default: the first of GET /v1/models)",
    )
    p.add_argument(
        "--dataset-name",
        default="generated-shared-prefix",
        choices=["random", "generated-shared-prefix", *TEXT_DATASETS],
        help="random / generated-shared-prefix: token ids; code-rewrite / quote-summary: text "
        "whose answers repeat it (bench/text_datasets.py; answers end naturally, up to "
        "--random-output-len tokens)",
    )
    p.add_argument("--num-prompts", type=int, default=64)
    p.add_argument("--random-input-len", type=int, default=512)
    p.add_argument("--random-output-len", type=int, default=64)
    p.add_argument("--random-range-ratio", type=float, default=0.0)
    p.add_argument("--gsp-num-groups", type=int, default=4)
    p.add_argument("--gsp-prompts-per-group", type=int, default=8)
    p.add_argument("--gsp-system-prompt-len", type=int, default=512)
    p.add_argument("--gsp-question-len", type=int, default=32)
    p.add_argument("--gsp-output-len", type=int, default=32)
    p.add_argument(
        "--gsp-question-seed",
        type=int,
        default=None,
        help="redraw the questions from this seed, keeping the system prompts (a warm pass "
        "over the cached prefix with new suffixes)",
    )
    p.add_argument(
        "--temperature", type=float, default=0.0, help="sampling temperature (0: greedy)"
    )
    p.add_argument("--request-rate", type=float, default=float("inf"))
    p.add_argument("--max-concurrency", type=int, default=None)
    p.add_argument("--vocab-size", type=int, default=49152)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--api-key", default=None)
    p.add_argument(
        "--json-schema",
        default=None,
        metavar="FILE",
        help="constrain every answer to the JSON schema in FILE and validate each answer",
    )
    p.add_argument("--output-file", default="bench-results/serving.json")
    p.set_defaults(handler=run_serving)


def build_requests(args: argparse.Namespace) -> list[BenchRequest]:
    if args.dataset_name in TEXT_DATASETS:
        return text_requests(args.dataset_name, args.num_prompts, args.random_output_len, args.seed)
    if args.dataset_name == "random":
        return random_requests(
            args.num_prompts,
            args.random_input_len,
            args.random_output_len,
            args.random_range_ratio,
            args.vocab_size,
            args.seed,
        )
    gsp = gsp_from_args(args, args.vocab_size, args.seed)
    reqs = generated_shared_prefix(gsp)
    if args.gsp_question_seed is None:
        return reqs
    rng = random.Random(args.gsp_question_seed)
    n = args.gsp_question_len
    return [
        BenchRequest(
            r.input_ids[:-n] + [rng.randrange(args.vocab_size) for _ in range(n)],
            r.output_len,
            r.group,
        )
        for r in reqs
    ]


class StreamRefused(Exception):
    """The server answered a streamed request with another status than 200."""


async def sse_chunks(
    client: httpx.AsyncClient, url: str, body: dict[str, Any], headers: Any = None
) -> AsyncIterator[dict[str, Any]]:
    """The JSON of each `data:` event of a streamed POST (`[DONE]` dropped); another status
    than 200 raises StreamRefused with the status and the start of the body."""
    async with client.stream("POST", url, json=body, headers=headers) as r:
        if r.status_code != 200:
            raise StreamRefused(f"HTTP {r.status_code}: {(await r.aread())[:200]!r}")
        async for line in r.aiter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                yield json.loads(line[6:])


async def send_one(
    client: httpx.AsyncClient,
    url: str,
    req: BenchRequest,
    headers: dict[str, str] | None = None,
    schema: dict[str, Any] | None = None,
    temperature: float = 0.0,
) -> RequestResult:
    params: dict[str, Any] = {"max_new_tokens": req.output_len, "temperature": temperature}
    if schema is not None:
        params["json_schema"] = json.dumps(schema)
    elif not req.text:  # a text prompt's answer ends where the model ends it
        params["ignore_eos"] = True
    prompt = {"text": req.text} if req.text else {"input_ids": req.input_ids}
    body = {**prompt, "stream": True, "sampling_params": params}
    res = RequestResult(ok=False, prompt_tokens=len(req.input_ids))
    start = last = time.perf_counter()
    try:
        async for chunk in sse_chunks(client, url + "/generate", body, headers):
            now = time.perf_counter()
            if res.ttft == 0.0:
                res.ttft = now - start
            else:
                res.itls.append(now - last)
            last = now
            meta = chunk["meta_info"]
            res.prompt_tokens = meta["prompt_tokens"]
            res.output_tokens = meta["completion_tokens"]
            res.cached_tokens = meta["cached_tokens"]
            res.text = chunk.get("text", "")  # SGLang's native stream: the text so far
        res.latency = time.perf_counter() - start
        res.ok = res.output_tokens > 0
    except StreamRefused as exc:
        res.error = str(exc)
    except httpx.HTTPError as exc:
        res.error = f"{type(exc).__name__}: {exc}"
    return res


async def send_one_openai(
    client: httpx.AsyncClient,
    url: str,
    req: BenchRequest,
    model: str,
    schema: dict[str, Any] | None = None,
    temperature: float = 0.0,
) -> RequestResult:
    """One streamed /v1/completions request; output tokens from the final usage chunk."""
    body: dict[str, Any] = {
        "model": model,
        "prompt": req.text or req.input_ids,
        "max_tokens": req.output_len,
        "temperature": temperature,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if schema is None and not req.text:
        body["ignore_eos"] = True
    elif schema is not None:
        body["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": "bench", "schema": schema, "strict": True},
        }
    res = RequestResult(ok=False, prompt_tokens=len(req.input_ids))
    start = last = time.perf_counter()
    try:
        async for chunk in sse_chunks(client, url + "/v1/completions", body):
            now = time.perf_counter()
            if chunk.get("choices") and chunk["choices"][0].get("text"):
                res.text += chunk["choices"][0]["text"]
                if res.ttft == 0.0:
                    res.ttft = now - start
                else:
                    res.itls.append(now - last)
                last = now
            if chunk.get("usage"):
                u = chunk["usage"]
                res.prompt_tokens = int(u.get("prompt_tokens") or res.prompt_tokens)
                res.output_tokens = int(u.get("completion_tokens") or 0)
                details = u.get("prompt_tokens_details") or {}
                res.cached_tokens = int(details.get("cached_tokens") or 0)
        res.latency = time.perf_counter() - start
        res.ok = res.output_tokens > 0
    except StreamRefused as exc:
        res.error = str(exc)
    except httpx.HTTPError as exc:
        res.error = f"{type(exc).__name__}: {exc}"
    return res


async def _model_name(client: httpx.AsyncClient, args: argparse.Namespace) -> str:
    if args.model:
        return str(args.model)
    r = await client.get(args.base_url + "/v1/models")
    r.raise_for_status()
    return str(r.json()["data"][0]["id"])


async def run_benchmark(
    args: argparse.Namespace, reqs: list[BenchRequest], schema: dict[str, Any] | None = None
) -> tuple[list[RequestResult], float]:
    """Send `reqs`, each constrained to `schema` where given (`load_schema(args.json_schema)`:
    read once by the caller, which also validates the answers against it)."""
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    limit = asyncio.Semaphore(args.max_concurrency or len(reqs))
    rng = random.Random(args.seed)
    bar = progress_bar(len(reqs), "bench serving", "req")  # stderr, only on a terminal

    async with httpx.AsyncClient(
        timeout=httpx.Timeout(600.0), headers=headers, limits=httpx.Limits(max_connections=None)
    ) as client:
        model = await _model_name(client, args) if args.backend == "openai" else ""

        async def guarded(req: BenchRequest) -> RequestResult:
            async with limit:
                if args.backend == "openai":
                    out = await send_one_openai(
                        client, args.base_url, req, model, schema, args.temperature
                    )
                else:
                    out = await send_one(
                        client, args.base_url, req, schema=schema, temperature=args.temperature
                    )
            bar.update()
            return out

        start = time.perf_counter()
        tasks = []
        for req in reqs:
            tasks.append(asyncio.create_task(guarded(req)))
            if args.request_rate != float("inf"):
                await asyncio.sleep(rng.expovariate(args.request_rate))
        results = await asyncio.gather(*tasks)
        bar.close()
        return list(results), time.perf_counter() - start


def _mean(values: list[float]) -> float:
    return statistics.fmean(values) if values else 0.0


def _pct(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    s = sorted(values)
    return s[min(int(q / 100 * len(s)), len(s) - 1)]


def load_schema(path: str | None) -> dict[str, Any] | None:
    if path is None:
        return None
    with open(path) as f:
        schema: dict[str, Any] = json.load(f)
    return schema


def schema_valid(results: list[RequestResult], schema: dict[str, Any]) -> int:
    """How many answers parse as JSON and validate against `schema`."""
    import jsonschema  # type: ignore[import-untyped]  # dev dependency: only this mode needs it

    valid = 0
    for r in results:
        try:
            jsonschema.validate(json.loads(r.text), schema)
        except (ValueError, jsonschema.ValidationError):
            continue
        valid += 1
    return valid


def summarize(
    results: list[RequestResult], duration: float, schema: dict[str, Any] | None = None
) -> dict[str, Any]:
    ok = [r for r in results if r.ok]
    n_in = sum(r.prompt_tokens for r in ok)
    n_out = sum(r.output_tokens for r in ok)
    ttfts = [r.ttft * 1000 for r in ok]
    tpots = [(r.latency - r.ttft) / (r.output_tokens - 1) * 1000 for r in ok if r.output_tokens > 1]
    itls = [x * 1000 for r in ok for x in r.itls]
    e2e = [r.latency * 1000 for r in ok]
    return {
        "successful": len(ok),
        "failed": len(results) - len(ok),
        "duration_s": duration,
        "input_tokens": n_in,
        "output_tokens": n_out,
        "request_throughput": len(ok) / duration,
        "input_throughput": n_in / duration,
        "output_throughput": n_out / duration,
        "total_throughput": (n_in + n_out) / duration,
        "mean_ttft_ms": _mean(ttfts),
        "median_ttft_ms": _pct(ttfts, 50),
        "p99_ttft_ms": _pct(ttfts, 99),
        "mean_tpot_ms": _mean(tpots),
        "median_tpot_ms": _pct(tpots, 50),
        "p99_tpot_ms": _pct(tpots, 99),
        "mean_itl_ms": _mean(itls),
        "median_itl_ms": _pct(itls, 50),
        "p95_itl_ms": _pct(itls, 95),
        "p99_itl_ms": _pct(itls, 99),
        "max_itl_ms": max(itls, default=0.0),
        "mean_e2e_ms": _mean(e2e),
        "median_e2e_ms": _pct(e2e, 50),
        "p99_e2e_ms": _pct(e2e, 99),
        "cache_hit_rate": sum(r.cached_tokens for r in ok) / max(n_in, 1),
        **({"schema_valid": schema_valid(ok, schema)} if schema is not None else {}),
        "errors": sorted({r.error for r in results if r.error})[:5],
    }


def run_serving(args: argparse.Namespace) -> int:
    reqs = build_requests(args)
    print(f"[bench] {len(reqs)} requests → {args.base_url}", file=sys.stderr, flush=True)
    schema = load_schema(args.json_schema)
    results, duration = asyncio.run(run_benchmark(args, reqs, schema))
    summary = summarize(results, duration, schema)
    rows = [{"metric": k, "value": v} for k, v in summary.items() if k != "errors"]
    print_table("serving benchmark", rows, ["metric", "value"])
    if summary["errors"]:
        print(f"errors: {summary['errors']}")
    settings = {k: v for k, v in vars(args).items() if k not in ("handler", "api_key")}
    write_json(args.output_file, {"benchmark": "serving", "args": settings, "results": summary})
    return 0 if summary["failed"] == 0 else 1
