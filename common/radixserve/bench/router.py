"""`radixserve bench router`: routing policies side by side on live replicas, plus the cost of
one routing decision.

Workload (`router_workload`): tenants × requests sharing a per-tenant prefix, arriving
interleaved, in random order or in bursts. For each policy the replicas' caches are flushed,
a router is started in front of them, the traffic runs through it, and the engines' own
`cached_tokens` are summed. `pinned` is the best placement there is: round-robin on a session
header set to the tenant, so each tenant lives on exactly one replica. `--peer-router-cmd`
starts any other router (sglang-router, or an older radixserve) in front of the same replicas
for the same traffic; `{worker_urls}` and `{port}` in the command are filled in.

`--api openai` sends `/v1/completions` instead of `/generate` (for engines without it, such as
vLLM); the cached ratio then comes from the engines' prefix-cache counters (vLLM's
`vllm:prefix_cache_hits_total` / `_queries_total`), and, as such engines cannot be flushed,
each router gets fresh tenants (seed + its row number).

Decision cost: a router's selector with T targets each holding `--decision-cached-tokens`
tokens in its mirror (fed through real KV events), timed over prompts that share prefixes.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import shlex
import subprocess
import sys
import time
from pathlib import Path
from types import MappingProxyType
from typing import Any

import httpx

from radixserve.bench.report import print_table, write_json
from radixserve.bench.router_decision import measure_decision
from radixserve.bench.router_workload import (
    APIS,
    ORDERS,
    SESSION_HEADER,
    TenantWorkload,
    build_requests,
    engine_counters,
    run_traffic,
)

POLICY_FLAGS = MappingProxyType(
    {
        "pinned": ["--policy", "round_robin", "--session-header", SESSION_HEADER],
    }
)
TABLE_COLUMNS = (
    "policy", "cached_ratio", "vs_pinned", "ok", "failed", "req_per_s", "median_ttft_ms",
    "median_e2e_ms", "per_replica", "cached_per_replica",
)  # fmt: skip


def add_router_bench_parser(sub: Any) -> None:
    p = sub.add_parser("router", help="routing policies side by side through the router")
    p.add_argument("--worker-urls", nargs="*", default=[], help="running replicas (else start)")
    p.add_argument("--replicas", type=int, default=3, help="replicas to start when no URLs")
    p.add_argument("--model-path", default="smollm2-135m")
    p.add_argument("--engine-args", default="", help="extra `serve` flags for started replicas")
    p.add_argument("--max-total-tokens", type=int, default=None,
                   help="KV pool of each started replica (small: eviction pressure)")  # fmt: skip
    p.add_argument("--threads-per-replica", type=int, default=None)
    p.add_argument("--policies", default="cache_aware,round_robin,pinned")
    p.add_argument("--peer-router-cmd", action="append", default=[],
                   help="another router for the same traffic ({worker_urls}, {port})")  # fmt: skip
    p.add_argument("--peer-name", action="append", default=[], help="its row name")
    p.add_argument("--tenants", "--gsp-num-groups", dest="tenants", type=int, default=6)
    p.add_argument("--per-tenant", "--gsp-prompts-per-group", dest="per_tenant", type=int,
                   default=8)  # fmt: skip
    p.add_argument("--prefix-len", "--gsp-system-prompt-len", dest="prefix_len", type=int,
                   default=600, help="words (text prompts) or tokens (id prompts)")  # fmt: skip
    p.add_argument("--question-len", "--gsp-question-len", dest="question_len", type=int,
                   default=32)  # fmt: skip
    p.add_argument("--output-len", "--gsp-output-len", dest="output_len", type=int, default=8)
    p.add_argument("--order", choices=ORDERS, default="interleaved")
    p.add_argument("--prompt-form", choices=("text", "ids"), default="text")
    p.add_argument(
        "--api",
        choices=APIS,
        default="native",
        help="openai: /v1/completions, cached tokens from the engines' counters",
    )
    p.add_argument(
        "--router-args",
        default="",
        help="extra flags for our router, e.g. --tokenizer-path for vLLM workers",
    )
    p.add_argument("--max-concurrency", type=int, default=6)
    p.add_argument("--vocab-size", type=int, default=49152)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--router-port", type=int, default=18000)
    p.add_argument("--decision-targets", type=int, default=3)
    p.add_argument("--decision-cached-tokens", type=int, default=100_000)
    p.add_argument("--decision-prompt-len", type=int, default=1000)
    p.add_argument("--decision-page-size", type=int, default=1)
    p.add_argument("--skip-workload", action="store_true", help="only the decision benchmark")
    p.add_argument("--skip-decision", action="store_true", help="only the workload")
    p.add_argument("--output-file", default="bench-results/router.json")
    p.set_defaults(handler=run_router_bench)


def workload_of(args: argparse.Namespace, row: int = 0) -> TenantWorkload:
    seed = args.seed + (row if args.api == "openai" else 0)  # unflushable engines: new tenants
    return TenantWorkload(
        args.tenants, args.per_tenant, args.prefix_len, args.question_len, args.output_len,
        args.order, args.prompt_form, seed, args.vocab_size,
    )  # fmt: skip


def _exe() -> str:
    return str(Path(sys.executable).with_name("radixserve"))


def router_command(args: argparse.Namespace, urls: list[str], policy: str) -> list[str]:
    """Our router with `policy`, or the peer command whose row name is `policy`."""
    peers = dict(zip(peer_names(args), args.peer_router_cmd, strict=True))
    if policy in peers:
        cmd = peers[policy].format(worker_urls=" ".join(urls), port=args.router_port)
        return shlex.split(cmd)
    flags = POLICY_FLAGS.get(policy, ["--policy", policy])
    return [
        _exe(), "router", "--port", str(args.router_port), "--worker-urls", *urls, *flags,
        "--health-check-interval-s", "1", *shlex.split(args.router_args),
    ]  # fmt: skip


def peer_names(args: argparse.Namespace) -> list[str]:
    names = list(args.peer_name)
    return names + [f"peer{i + 1}" for i in range(len(names), len(args.peer_router_cmd))]


def start_router(args: argparse.Namespace, urls: list[str], policy: str) -> subprocess.Popen[bytes]:
    slug = "".join(c if c.isalnum() else "-" for c in policy)
    log = open(f"/tmp/radixserve-bench-router-{slug}.log", "wb")  # noqa: SIM115 - child owns it
    cmd = router_command(args, urls, policy)
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd="/tmp")


def wait_ready(url: str, proc: subprocess.Popen[bytes], timeout: float = 180) -> None:
    """Until the router's /readiness (or, for a router without one, /health) answers 200."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"router exited with {proc.returncode}")
        for path in ("/readiness", "/health"):
            try:
                status = httpx.get(url + path, timeout=2).status_code
            except httpx.HTTPError:
                break
            if status == 200:
                return
            if status != 404:
                break
        time.sleep(0.5)
    raise RuntimeError(f"{url} not ready after {timeout}s")


def warm_up(url: str, api: str = "native", timeout: float = 120) -> None:
    """One tiny request until the router answers it: every replica registered and healthy."""
    deadline = time.monotonic() + timeout
    body: dict[str, Any] = {"text": "hi", "sampling_params": {"max_new_tokens": 1}}
    path = "/generate"
    if api == "openai":
        path, body = "/v1/completions", {"prompt": "hi", "max_tokens": 1}
    while time.monotonic() < deadline:
        try:
            if httpx.post(url + path, json=body, timeout=60).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1.0)
    raise RuntimeError(f"{url} answered no request after {timeout}s")


def run_policy(
    args: argparse.Namespace, urls: list[str], policy: str, row: int = 0
) -> dict[str, Any]:
    router_url = f"http://127.0.0.1:{args.router_port}"
    proc = start_router(args, urls, policy)
    try:
        wait_ready(router_url, proc)
        time.sleep(2.0)  # let every replica pass its first health check
        warm_up(router_url, args.api)
        if args.api == "native":
            for u in urls:  # after the warm-up: every row starts from empty caches
                httpx.post(u + "/flush_cache", timeout=30).raise_for_status()
            time.sleep(1.0)  # the flush's AllBlocksCleared reaches the mirrors
        reqs = build_requests(workload_of(args, row))
        print(f"[bench] {policy}: {len(reqs)} requests, order {args.order}",
              file=sys.stderr, flush=True)  # fmt: skip
        before = engine_counters(urls)
        results, duration = asyncio.run(
            run_traffic(router_url, reqs, args.max_concurrency, policy == "pinned", args.api)
        )
        after = engine_counters(urls)
    finally:
        proc.terminate()
        proc.wait(20)
    ok = [r for r in results if r.ok]
    delta = {k: [b[k] - a[k] for a, b in zip(before, after, strict=True)] for k in before[0]}
    prompt = sum(r.prompt_tokens for r in ok)
    cached = sum(r.cached_tokens for r in ok)
    if args.api == "openai":  # the engines' own prefix-cache counters over the row
        prompt, cached = sum(delta["prompt"]), sum(delta["cached"])
    ttfts = sorted(r.ttft_s * 1000 for r in ok) or [0.0]
    e2es = sorted(r.latency_s * 1000 for r in ok) or [0.0]
    return {
        "policy": policy,
        "cached_ratio": round(cached / max(prompt, 1), 3),
        "ok": len(ok),
        "failed": len(results) - len(ok),
        "prompt_tokens": prompt,
        "req_per_s": len(ok) / duration,
        "median_ttft_ms": ttfts[len(ttfts) // 2],
        "median_e2e_ms": e2es[len(e2es) // 2],
        "per_replica": "/".join(str(n) for n in delta["requests"]),
        "cached_per_replica": "/".join(str(n) for n in delta["cached"]),
        "errors": sorted({r.error for r in results if r.error})[:5],
        # in arrival order: tenant, prompt and cached tokens (JSON only, for per-tenant study)
        "requests": [[r.tenant, r.prompt_tokens, r.cached_tokens] for r in results],
    }


def run_router_bench(args: argparse.Namespace) -> int:
    payload: dict[str, Any] = {"config": {k: v for k, v in vars(args).items() if k != "handler"}}
    if not args.skip_workload:
        payload["policies"] = _run_workloads(args)
    if not args.skip_decision:
        decision = measure_decision(
            args.decision_targets,
            args.decision_cached_tokens,
            args.decision_prompt_len,
            args.decision_page_size,
            random.Random(args.seed),
        )
        payload["decision"] = decision
        print_table(
            "routing decision (selector: views + prefix match + policy)",
            [decision],
            ["targets", "cached_tokens_per_target", "prompt_len", "page_size", "p50_us",
             "p99_us", "mean_us", "with_cache_hit"],
        )  # fmt: skip
    write_json(args.output_file, payload)
    return 0


def _run_workloads(args: argparse.Namespace) -> list[dict[str, Any]]:
    from radixserve.local_stack import start_replica, stop_replicas, wait_ready_replicas

    replicas = []
    urls = list(args.worker_urls)
    if not urls:
        engine_args = args.engine_args
        if args.max_total_tokens:
            engine_args += f" --max-total-tokens {args.max_total_tokens}"
        threads = args.threads_per_replica or max(1, (os.cpu_count() or 1) // args.replicas)
        up = argparse.Namespace(
            engine_base_port=31000, kv_events_base_port=15557, log_dir="/tmp/radixserve-bench",
            model_path=args.model_path, engine_args=engine_args, threads_per_replica=threads,
            log_format="text",
        )  # fmt: skip
        replicas = [start_replica(up, i) for i in range(args.replicas)]
        wait_ready_replicas(replicas)
        urls = [r.url for r in replicas]
    try:
        names = [*args.policies.split(","), *peer_names(args)]
        rows = [run_policy(args, urls, p, i) for i, p in enumerate(names)]
    finally:
        stop_replicas(replicas)
    pinned = next((r["cached_ratio"] for r in rows if r["policy"] == "pinned"), None)
    for row in rows:
        row["vs_pinned"] = round(row["cached_ratio"] / pinned, 3) if pinned else ""
    print_table(
        f"router policies: {args.tenants} tenants × {args.per_tenant} requests, "
        f"{args.prefix_len}-{'word' if args.prompt_form == 'text' else 'token'} prefixes, "
        f"order {args.order}, {len(urls)} replicas, max_total_tokens {args.max_total_tokens}",
        rows,
        TABLE_COLUMNS,
    )
    return rows
