"""`radixserve up`: a whole local stack, N engine replicas + the router, on one machine.

Each replica is a `radixserve serve` child (one CPU thread each unless told otherwise, so N
replicas share the cores instead of fighting over them) with KV events on; the router runs in
this process and finds the replicas through the static list. Ctrl-C stops the router, then
the replicas (SIGINT, SIGKILL after a grace period); a replica that dies at start-up stops
everything with its log's tail.
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from radixserve.logging_setup import add_logging_args

STARTUP_TIMEOUT_S = 600
STOP_GRACE_S = 10


@dataclass(frozen=True)
class Replica:
    index: int
    port: int
    kv_events_port: int
    proc: subprocess.Popen[bytes]
    log_path: Path
    role: str | None = None  # prefill / decode with `up --prefill N --decode M`
    bootstrap_port: int | None = None  # a prefill's

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log_tail(self, n: int = 3000) -> str:
        return self.log_path.read_text(errors="replace")[-n:]


def add_up_parser(sub: Any) -> None:
    p = sub.add_parser("up", help="run N engine replicas and the router locally")
    p.add_argument("--replicas", type=int, default=2)
    p.add_argument(
        "--prefill", type=int, default=0, help="prefill replicas (with --decode: PD, no --replicas)"
    )
    p.add_argument("--decode", type=int, default=0, help="decode replicas (with --prefill)")
    p.add_argument("--bootstrap-base-port", type=int, default=8998, help="prefill i: base + i")
    p.add_argument("--model-path", default="smollm2-135m")
    p.add_argument("--host", default="127.0.0.1", help="router address")
    p.add_argument("--port", type=int, default=8000, help="router port")
    p.add_argument("--engine-base-port", type=int, default=30000)
    p.add_argument("--kv-events-base-port", type=int, default=5557)
    p.add_argument("--threads-per-replica", type=int, default=1)
    p.add_argument("--policy", default="cache_aware")
    p.add_argument("--engine-args", default="", help='extra `serve` flags, e.g. "--page-size 16"')
    p.add_argument("--router-args", default="", help="extra `router` flags")
    p.add_argument("--log-dir", default="/tmp/radixserve-up")
    add_logging_args(p)
    p.set_defaults(handler=run_up)


def _console_script() -> str:
    # Not `python -m`: run from a repo checkout, the top-level operator/ folder would shadow
    # the standard library's `operator`.
    return str(Path(sys.executable).with_name("radixserve"))


def roles(args: argparse.Namespace) -> list[str | None]:
    """Each replica's role: N co-located ones, or --prefill prefills then --decode decodes."""
    if args.prefill or args.decode:
        if args.prefill < 1 or args.decode < 1:
            raise ValueError("prefill / decode: both must be ≥ 1 for a PD stack")
        pd: list[str | None] = ["prefill"] * args.prefill
        return pd + ["decode"] * args.decode
    if args.replicas < 1:
        raise ValueError(f"replicas: must be ≥ 1, got {args.replicas}")
    return [None] * args.replicas


def _role_flags(args: argparse.Namespace, index: int, role: str | None) -> list[str]:
    if role is None:
        return []
    flags = ["--disaggregation-mode", role]
    if role == "prefill":
        flags += ["--disaggregation-bootstrap-port", str(args.bootstrap_base_port + index)]
    return flags


def start_replica(args: argparse.Namespace, index: int, role: str | None = None) -> Replica:
    port = args.engine_base_port + index
    kv_port = args.kv_events_base_port + 2 * index  # +1 is the replay port
    log_dir = Path(args.log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"engine-{index}.log"
    cmd = [
        _console_script(), "serve", "--model-path", args.model_path,
        "--host", "127.0.0.1", "--port", str(port), "--kv-events-port", str(kv_port),
        "--log-format", args.log_format, *_role_flags(args, index, role),
        *shlex.split(args.engine_args),
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads_per_replica)}
    with log_path.open("wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    bootstrap = args.bootstrap_base_port + index if role == "prefill" else None
    return Replica(index, port, kv_port, proc, log_path, role, bootstrap)


def worker_flags(replicas: list[Replica]) -> list[str]:
    """The router's workers: --worker-urls, or sglang-router's PD shape for a PD stack."""
    if all(r.role is None for r in replicas):
        return ["--worker-urls", *(r.url for r in replicas)]
    flags = ["--pd-disaggregation"]
    for r in replicas:
        if r.role == "prefill":
            flags += ["--prefill", r.url, str(r.bootstrap_port)]
        else:
            flags += ["--decode", r.url]
    return flags


def wait_ready_replicas(replicas: list[Replica]) -> None:
    """Poll /health of each replica; print progress; raise on a dead one or a timeout."""
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    pending = list(replicas)
    while pending:
        for r in list(pending):
            if r.proc.poll() is not None:
                raise RuntimeError(f"engine {r.index} exited during start-up:\n{r.log_tail()}")
            try:
                if httpx.get(r.url + "/health", timeout=2).status_code == 200:
                    pending.remove(r)
                    print(f"  engine {r.index} ready on {r.url} ({len(replicas) - len(pending)}"
                          f"/{len(replicas)})", flush=True)  # fmt: skip
            except httpx.HTTPError:
                pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"engines not ready after {STARTUP_TIMEOUT_S}s")
        if pending:
            time.sleep(1)


def stop_replicas(replicas: list[Replica]) -> None:
    for r in replicas:
        if r.proc.poll() is None:
            r.proc.send_signal(signal.SIGINT)
    for r in replicas:
        try:
            r.proc.wait(STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            r.proc.kill()
            r.proc.wait(5)


def ready_table(args: argparse.Namespace, replicas: list[Replica]) -> str:
    """What runs where: one row per replica (HTTP, KV events and replay, metrics, log) and
    one for the router."""
    router = f"http://{args.host}:{args.port}"
    rows = [("", "url", "kv events (replay)", "metrics", "log")]
    for r in replicas:
        kv = f"tcp://127.0.0.1:{r.kv_events_port} ({r.kv_events_port + 1})"
        name = f"engine {r.index}" + (f" ({r.role})" if r.role else "")
        rows.append((name, r.url, kv, f"{r.url}/metrics", str(r.log_path)))
    rows.append((f"router ({args.policy})", router, "", f"{router}/metrics", "this terminal"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  " + "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    )


def _banner(args: argparse.Namespace) -> str:
    base = f"http://{args.host}:{args.port}"
    return (
        f"router ({args.policy}) on {base} in front of {len(roles(args))} replicas; Ctrl-C stops "
        "all\n"
        f"  curl {base}/v1/chat/completions -H 'Content-Type: application/json' "
        f'-d \'{{"model": "{args.model_path}", "messages": [{{"role": "user", '
        f'"content": "Hello!"}}]}}\'\n'
        f"  metrics: {base}/metrics"
    )


def run_up(args: argparse.Namespace) -> int:
    kinds = roles(args)
    from radixserve.router_cli import add_router_parser

    print(f"starting {len(kinds)} engine replicas (logs in {args.log_dir})", flush=True)
    replicas = [start_replica(args, i, role) for i, role in enumerate(kinds)]
    try:
        wait_ready_replicas(replicas)
        parser = argparse.ArgumentParser(prog="radixserve up")
        add_router_parser(parser.add_subparsers())
        router_argv = [
            "router", "--host", args.host, "--port", str(args.port), "--policy", args.policy,
            *worker_flags(replicas), *shlex.split(args.router_args),
        ]  # fmt: skip
        router_args = parser.parse_args(router_argv)
        router_args.log_level = args.log_level
        router_args.log_format = args.log_format
        print(ready_table(args, replicas), flush=True)
        print(_banner(args), flush=True)
        return int(router_args.handler(router_args))
    except KeyboardInterrupt:
        return 0
    finally:
        print("stopping engine replicas", flush=True)
        stop_replicas(replicas)
