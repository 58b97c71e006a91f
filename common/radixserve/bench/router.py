"""`radixserve bench router`: routing policies side by side on live replicas, plus the cost of
one routing decision.

Workload: multi-tenant shared prefixes (G groups × R requests, each a group prefix + its own
question), arriving interleaved (one request of every group per round, the order rotated each
round) so a cache-blind policy scatters every tenant. For each policy the replicas' caches
are flushed, a router is started in front of them, the workload runs through it, and the
engines' own `cached_tokens` are summed.
`pinned` is the best placement there is: round-robin on a session header set to the group,
so each group lives on exactly one replica.

Decision cost: a router's selector with T targets each holding `--decision-cached-tokens`
tokens in its mirror (fed through real KV events), timed over prompts that share prefixes.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import re
import subprocess
import sys
import time
from pathlib import Path
from types import MappingProxyType
from typing import Any

import httpx

from radixserve.bench.datasets import BenchRequest, GSPConfig, generated_shared_prefix
from radixserve.bench.report import print_table, write_json
from radixserve.bench.router_decision import measure_decision
from radixserve.bench.serving import RequestResult, send_one, summarize

SESSION_HEADER = "x-session-id"
POLICY_FLAGS = MappingProxyType(
    {
        "pinned": ["--policy", "round_robin", "--session-header", SESSION_HEADER],
    }
)


def add_router_bench_parser(sub: Any) -> None:
    p = sub.add_parser("router", help="routing policies side by side through the router")
    p.add_argument("--worker-urls", nargs="*", default=[], help="running replicas (else start)")
    p.add_argument("--replicas", type=int, default=3, help="replicas to start when no URLs")
    p.add_argument("--model-path", default="smollm2-135m")
    p.add_argument("--engine-args", default="", help="extra `serve` flags for started replicas")
    p.add_argument("--policies", default="cache_aware,round_robin,pinned")
    p.add_argument("--gsp-num-groups", type=int, default=6)
    p.add_argument("--gsp-prompts-per-group", type=int, default=8)
    p.add_argument("--gsp-system-prompt-len", type=int, default=600)
    p.add_argument("--gsp-question-len", type=int, default=32)
    p.add_argument("--gsp-output-len", type=int, default=8)
    p.add_argument("--max-concurrency", type=int, default=6)
    p.add_argument("--vocab-size", type=int, default=49152)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--router-port", type=int, default=18000)
    p.add_argument("--decision-targets", type=int, default=3)
    p.add_argument("--decision-cached-tokens", type=int, default=100_000)
    p.add_argument("--decision-prompt-len", type=int, default=1000)
    p.add_argument("--decision-page-size", type=int, default=1)
    p.add_argument("--skip-workload", action="store_true", help="only the decision benchmark")
    p.add_argument("--output-file", default="bench-results/router.json")
    p.set_defaults(handler=run_router_bench)


def interleaved_workload(args: argparse.Namespace) -> list[BenchRequest]:
    cfg = GSPConfig(
        args.gsp_num_groups, args.gsp_prompts_per_group, args.gsp_system_prompt_len,
        args.gsp_question_len, args.gsp_output_len, args.vocab_size, args.seed, shuffle=False,
    )  # fmt: skip
    reqs = generated_shared_prefix(cfg)
    per, groups = args.gsp_prompts_per_group, args.gsp_num_groups
    # round i sends one request of every group, the group order rotated by i: interleaved, and
    # never in lockstep with round-robin (which would pin each group by accident)
    return [reqs[((k + i) % groups) * per + i] for i in range(per) for k in range(groups)]


def _exe() -> str:
    return str(Path(sys.executable).with_name("radixserve"))


def start_router(args: argparse.Namespace, urls: list[str], policy: str) -> subprocess.Popen[bytes]:
    flags = POLICY_FLAGS.get(policy, ["--policy", policy])
    cmd = [
        _exe(), "router", "--port", str(args.router_port), "--worker-urls", *urls, *flags,
        "--health-check-interval-s", "1",
    ]  # fmt: skip
    log = open(f"/tmp/radixserve-bench-router-{policy}.log", "wb")  # noqa: SIM115 - child owns it
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd="/tmp")


def wait_ready(url: str, proc: subprocess.Popen[bytes], timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"router exited with {proc.returncode}")
        try:
            if httpx.get(url + "/readiness", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"{url} not ready after {timeout}s")


async def run_workload(
    url: str, reqs: list[BenchRequest], concurrency: int, pinned: bool
) -> tuple[list[RequestResult], float]:
    limit = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(timeout=httpx.Timeout(600.0)) as client:

        async def one(req: BenchRequest) -> RequestResult:
            headers = {SESSION_HEADER: f"group-{req.group}"} if pinned else None
            async with limit:
                return await send_one(client, url, req, headers)

        start = time.perf_counter()
        results = await asyncio.gather(*(one(r) for r in reqs))
        return list(results), time.perf_counter() - start


def requests_per_worker(metrics_text: str) -> dict[str, int]:
    out: dict[str, int] = {}
    pattern = r'radixserve_router_requests_total\{.*?worker="([^"]+)".*?\} ([0-9.e+]+)'
    for worker, value in re.findall(pattern, metrics_text):
        out[worker] = out.get(worker, 0) + int(float(value))
    return dict(sorted(out.items()))


def run_policy(args: argparse.Namespace, urls: list[str], policy: str) -> dict[str, Any]:
    for u in urls:
        httpx.post(u + "/flush_cache", timeout=30).raise_for_status()
    router_url = f"http://127.0.0.1:{args.router_port}"
    proc = start_router(args, urls, policy)
    try:
        wait_ready(router_url, proc)
        time.sleep(1.0)  # let every replica pass its first health check
        print(f"[bench] policy {policy}: {args.gsp_num_groups * args.gsp_prompts_per_group}"
              " requests", file=sys.stderr, flush=True)  # fmt: skip
        reqs = interleaved_workload(args)
        results, duration = asyncio.run(
            run_workload(router_url, reqs, args.max_concurrency, policy == "pinned")
        )
        spread = requests_per_worker(httpx.get(router_url + "/metrics").text)
    finally:
        proc.terminate()
        proc.wait(20)
    s = summarize(results, duration)
    return {
        "policy": policy,
        "cached_ratio": s["cache_hit_rate"],
        "ok": s["successful"],
        "failed": s["failed"],
        "req_per_s": s["request_throughput"],
        "median_ttft_ms": s["median_ttft_ms"],
        "p99_ttft_ms": s["p99_ttft_ms"],
        "median_e2e_ms": s["median_e2e_ms"],
        "per_replica": "/".join(str(v) for v in spread.values()),
        "errors": s["errors"],
    }


def upper_bound(args: argparse.Namespace) -> float:
    """Cached share if every group lived on one replica and nothing were evicted."""
    prefix: int = args.gsp_system_prompt_len
    question: int = args.gsp_question_len
    per: int = args.gsp_prompts_per_group
    cached = (per - 1) * prefix  # the first request of a group has nothing cached
    return cached / (per * (prefix + question))


def run_router_bench(args: argparse.Namespace) -> int:
    payload: dict[str, Any] = {"config": {k: v for k, v in vars(args).items() if k != "handler"}}
    if not args.skip_workload:
        payload["policies"] = _run_workloads(args)
        payload["upper_bound_cached_ratio"] = upper_bound(args)
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
        ["targets", "cached_tokens_per_target", "prompt_len", "page_size", "p50_us", "p99_us",
         "mean_us", "with_cache_hit"],
    )  # fmt: skip
    write_json(args.output_file, payload)
    return 0


def _run_workloads(args: argparse.Namespace) -> list[dict[str, Any]]:
    from radixserve.local_stack import start_replica, stop_replicas, wait_ready_replicas

    replicas = []
    urls = list(args.worker_urls)
    if not urls:
        up = argparse.Namespace(
            engine_base_port=31000, kv_events_base_port=15557, log_dir="/tmp/radixserve-bench",
            model_path=args.model_path, engine_args=args.engine_args,
            threads_per_replica=max(1, (os.cpu_count() or 1) // args.replicas),
        )  # fmt: skip
        replicas = [start_replica(up, i) for i in range(args.replicas)]
        wait_ready_replicas(replicas)
        urls = [r.url for r in replicas]
    try:
        rows = [run_policy(args, urls, p) for p in args.policies.split(",")]
    finally:
        stop_replicas(replicas)
    print_table(
        f"router policies: {args.gsp_num_groups} groups × {args.gsp_prompts_per_group} requests, "
        f"{args.gsp_system_prompt_len}-token prefixes, {len(urls)} replicas "
        f"(upper bound {upper_bound(args):.3f})",
        rows,
        ["policy", "cached_ratio", "ok", "failed", "req_per_s", "median_ttft_ms", "p99_ttft_ms",
         "median_e2e_ms", "per_replica"],
    )  # fmt: skip
    return rows
