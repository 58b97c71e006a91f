"""`radixserve bench router-overhead`: what a router costs per proxied request, ours beside
sglang-router, on fake engines fast enough that the router is all there is to measure.

Two fake engines (`fake_engine`, each its own process) answer the discovery routes and
`/v1/chat/completions` with bodies captured from a live radixserve engine (`router_capture`;
the capture is saved and reused, and taken from `--capture-from`, or from an engine started for
it). Each router in turn is started in front of both with `cache_aware`, and chats of tenants
that share system prompts (`router_load.ChatLoad`) are sent through it, plain and streamed, at
each concurrency (`--peer-router-cmd` adds any other router, such as an older radixserve). Per
row: the router's CPU per request (user + system time of its whole process tree, read from
/proc before and after), requests per second, latency p50/p99, and the latency it adds over
the same load sent straight to the fakes (`direct`).

The client, the fakes and the router share the machine: on a busy or small machine the
requests per second and latencies say more about the machine than the router; the CPU per
request does not depend on them much.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from radixserve.bench.report import print_table, write_json
from radixserve.bench.router import peer_names, wait_ready
from radixserve.bench.router_capture import Capture, capture_from, load_capture, save_capture
from radixserve.bench.router_load import ChatLoad, measure

MODES = ("plain", "stream")
COLUMNS = (
    "router", "mode", "concurrency", "ok", "failed", "cpu_ms_per_req", "sys_ms_per_req",
    "req_per_s", "p50_ms", "p99_ms", "added_p50_ms", "added_p99_ms",
)  # fmt: skip
CHAT_PATH = "/v1/chat/completions"


def add_router_overhead_parser(sub: Any) -> None:
    p = sub.add_parser(
        "router-overhead", help="a router's CPU and latency per proxied request, on fake engines"
    )
    p.add_argument("--capture-file", default="bench-results/router-overhead-capture.json",
                   help="the fakes' answers (made once from an engine, then reused)")  # fmt: skip
    p.add_argument("--capture-from", default=None, help="a live engine URL to capture from")
    p.add_argument("--model-path", default="smollm2-135m",
                   help="the engine started for a capture when there is none")  # fmt: skip
    p.add_argument("--sglang-router-venv", default=None,
                   help="sglang-router's venv (scripts/peers/setup_sglang_router.sh)")  # fmt: skip
    p.add_argument("--routers", default="direct,radixserve,sglang-router")
    p.add_argument(
        "--peer-router-cmd",
        action="append",
        default=[],
        help="another router, e.g. an older radixserve ({worker_urls}, {port})",
    )
    p.add_argument("--peer-name", action="append", default=[], help="its row name")
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--concurrency", default="1,32,256")
    p.add_argument("--requests", type=int, default=2000, help="measured requests per row")
    p.add_argument("--warmup-requests", type=int, default=200)
    p.add_argument("--tenants", type=int, default=8)
    p.add_argument("--system-words", type=int, default=200)
    p.add_argument("--token-interval-ms", type=float, default=1.0,
                   help="the fakes' gap between stream events")  # fmt: skip
    p.add_argument("--router-args", default="", help="extra flags for our router")
    p.add_argument("--base-port", type=int, default=18100)
    p.add_argument("--output-file", default="bench-results/router-overhead.json")
    p.set_defaults(handler=run_router_overhead)


# ---- processes ----------------------------------------------------------------------------------


def ensure_capture(args: argparse.Namespace) -> Capture:
    path = Path(args.capture_file)
    if args.capture_from:
        save_capture(capture_from(args.capture_from), path)
    elif not path.exists():
        save_capture(_capture_from_a_started_engine(args), path)
    return load_capture(path)


def _capture_from_a_started_engine(args: argparse.Namespace) -> Capture:
    from radixserve.local_stack import start_replica, stop_replicas, wait_ready_replicas

    up = argparse.Namespace(
        engine_base_port=args.base_port + 20, kv_events_base_port=args.base_port + 30,
        log_dir="/tmp/radixserve-bench", model_path=args.model_path, engine_args="",
        threads_per_replica=max(1, os.cpu_count() or 1), log_format="text",
    )  # fmt: skip
    replica = start_replica(up, 0)
    try:
        wait_ready_replicas([replica])
        return capture_from(replica.url)
    finally:
        stop_replicas([replica])


def _spawn(cmd: list[str], log_name: str) -> subprocess.Popen[bytes]:
    log = open(f"/tmp/radixserve-bench-{log_name}.log", "wb")  # noqa: SIM115 - child owns it
    return subprocess.Popen(
        cmd, stdout=log, stderr=subprocess.STDOUT, cwd="/tmp", start_new_session=True
    )


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


@contextlib.contextmanager
def fake_engines(args: argparse.Namespace, n: int = 2) -> Iterator[list[str]]:
    ports = [args.base_port + i for i in range(n)]
    procs = [
        _spawn(
            [
                sys.executable,
                "-m",
                "radixserve.bench.fake_engine",
                "--port",
                str(port),
                "--capture-file",
                str(Path(args.capture_file).resolve()),
                "--token-interval-ms",
                str(args.token_interval_ms),
            ],
            f"fake-engine-{port}",
        )  # fmt: skip
        for port in ports
    ]
    try:
        urls = [f"http://127.0.0.1:{port}" for port in ports]
        for url, proc in zip(urls, procs, strict=True):
            wait_ready(url, proc, timeout=30)
        yield urls
    finally:
        for proc in procs:
            _stop(proc)


def router_command(args: argparse.Namespace, name: str, urls: list[str], port: int) -> list[str]:
    peers = dict(zip(peer_names(args), args.peer_router_cmd, strict=True))
    if name in peers:
        return shlex.split(peers[name].format(worker_urls=" ".join(urls), port=port))
    if name == "radixserve":
        exe = str(Path(sys.executable).with_name("radixserve"))
        return [
            exe, "router", "--port", str(port), "--worker-urls", *urls, "--policy",
            "cache_aware", *args.router_args.split(),
        ]  # fmt: skip
    if name == "sglang-router":
        if not args.sglang_router_venv:
            raise ValueError("sglang-router: pass --sglang-router-venv")
        python = str(Path(args.sglang_router_venv) / "bin" / "python")
        # warn: no access line per request (ours logs none by default either)
        return [
            python, "-m", "sglang_router.launch_router", "--host", "127.0.0.1", "--port",
            str(port), "--worker-urls", *urls, "--policy", "cache_aware", "--log-level", "warn",
        ]  # fmt: skip
    raise ValueError(f"routers: unknown router {name!r} (radixserve, sglang-router, direct)")


def warm_up_chat(url: str, model: str, proc: subprocess.Popen[bytes], timeout: float = 120) -> None:
    """Until a chat through the router at `url` is a 200: both engines found healthy, our
    router's tokenizer fetched (its first request)."""
    wait_ready(url, proc)
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.post(url + CHAT_PATH, json=body, timeout=30).status_code == 200:
                time.sleep(1.0)  # the other engine's first health check too
                return
        time.sleep(0.5)
    raise RuntimeError(f"{url} answered no chat after {timeout}s")


@contextlib.contextmanager
def started_router(
    args: argparse.Namespace, name: str, urls: list[str], model: str
) -> Iterator[tuple[int | None, list[str]]]:
    """(the router's pid, the URLs to send chats to); `direct` is the engines themselves."""
    if name == "direct":
        yield None, [u + CHAT_PATH for u in urls]
        return
    port = args.base_port + 10
    proc = _spawn(router_command(args, name, urls, port), f"overhead-{name}")
    url = f"http://127.0.0.1:{port}"
    try:
        warm_up_chat(url, model, proc)
        yield proc.pid, [url + CHAT_PATH]
    finally:
        _stop(proc)


# ---- the run ------------------------------------------------------------------------------------


def run_rows(args: argparse.Namespace, capture: Capture) -> list[dict[str, Any]]:
    load = ChatLoad(args.tenants, args.system_words, model=capture.model_name)
    concurrencies = [int(c) for c in args.concurrency.split(",")]
    rows = []
    with fake_engines(args) as urls:
        for name in [*args.routers.split(","), *peer_names(args)]:
            with started_router(args, name, urls, capture.model_name) as (pid, targets):
                for mode in args.modes.split(","):
                    stream = mode == "stream"
                    for c in concurrencies:
                        warm = load.bodies(args.warmup_requests, stream)
                        measure(None, targets, warm, c, stream)
                        bodies = load.bodies(args.requests, stream)
                        row = measure(pid, targets, bodies, c, stream)
                        rows.append({"router": name, "mode": mode, "concurrency": c, **row})
                        print(f"[bench] {name} {mode} c={c}: {row}", file=sys.stderr, flush=True)
    return _with_added_latency(rows)


def _with_added_latency(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    direct = {(r["mode"], r["concurrency"]): r for r in rows if r["router"] == "direct"}
    for r in rows:
        base = direct.get((r["mode"], r["concurrency"]))
        if base is not None and r["router"] != "direct":
            r["added_p50_ms"] = round(r["p50_ms"] - base["p50_ms"], 2)
            r["added_p99_ms"] = round(r["p99_ms"] - base["p99_ms"], 2)
    return rows


def run_router_overhead(args: argparse.Namespace) -> int:
    capture = ensure_capture(args)
    started = time.time()
    rows = run_rows(args, capture)
    load = os.getloadavg()
    title = (
        f"router overhead: {args.requests} chats per row, {args.tenants} tenants, "
        f"{args.system_words}-word system prompts, {len(capture.stream) - 1} stream events "
        f"{args.token_interval_ms} ms apart; load average {load[0]:.1f}"
    )
    print_table(title, rows, COLUMNS)
    config = {k: v for k, v in vars(args).items() if k != "handler"}
    write_json(
        args.output_file,
        {"config": config, "started": started, "load_average": load, "rows": rows},
    )
    return 0 if all(r["failed"] == 0 for r in rows) else 1
