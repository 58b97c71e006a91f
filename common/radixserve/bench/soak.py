"""`radixserve bench soak`: mixed traffic through the router to N local replicas while one
replica is killed (SIGKILL, its whole process tree) and restarted every `--kill-every-s`.

Bounded in time (`--duration-s`) and in count (`--max-requests`). The mix: /generate plain and
streamed, /v1/completions with n=2 and logprobs, /v1/chat/completions streamed with a stop
string, streams the client leaves after two events, and requests the client gives up on
(aborts). Every request is classified:

- completed: a 200 whose stream (if any) ended with `[DONE]` and no error event;
- failed before the first byte: any other status, or a transport error before an answer (the
  router retries these on another replica, so this must be 0);
- failed after the first byte: a stream that broke; `clean` when it ended with an SSE error
  event and `[DONE]` (the router's promise), `unclean` otherwise;
- left by the client: the disconnects and aborts of the mix (not failures).

At the end it waits for the replicas to go idle and reports their KV token usage (must be 0),
and the resident memory and open fds of every process tree at the start and the end.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import shlex
import signal
import subprocess
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from radixserve.bench.report import print_table, write_json
from radixserve.local_stack import (
    Replica,
    _console_script,
    start_replica,
    stop_replicas,
    wait_ready_replicas,
)

KINDS = ("generate", "generate_stream", "completions_n2_logprobs", "chat_stream_stop",
         "stream_disconnect", "abort")  # fmt: skip


def add_soak_parser(sub: Any) -> None:
    p = sub.add_parser("soak", help="mixed traffic through the router while replicas are killed")
    p.add_argument("--model-path", default="smollm2-135m")
    p.add_argument("--replicas", type=int, default=3)
    p.add_argument("--duration-s", type=float, default=600.0)
    p.add_argument("--max-requests", type=int, default=100_000)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--kill-every-s", type=float, default=120.0, help="0: never kill")
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--router-port", type=int, default=8100)
    p.add_argument("--engine-base-port", type=int, default=30100)
    p.add_argument("--kv-events-base-port", type=int, default=5657)
    p.add_argument("--threads-per-replica", type=int, default=1)
    p.add_argument("--engine-args", default="", help="extra `serve` flags")
    p.add_argument("--router-args", default="", help="extra `router` flags")
    p.add_argument("--log-dir", default="/tmp/radixserve-soak")
    p.add_argument("--log-format", default="text")
    p.add_argument("--output", default=None, help="JSON report path")
    p.set_defaults(handler=run_soak)


# ---- processes ----------------------------------------------------------------------------------


def tree_pids(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        with contextlib.suppress(OSError):
            for task in Path(f"/proc/{p}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
    return out


def tree_usage(pid: int) -> dict[str, int]:
    """Resident memory (KiB) and open fds of a process and its descendants."""
    rss = fds = 0
    for p in tree_pids(pid):
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    rss += int(line.split()[1])
            fds += len(os.listdir(f"/proc/{p}/fd"))
    return {"rss_kib": rss, "fds": fds}


def kill_tree(pid: int) -> None:
    for p in reversed(tree_pids(pid)):
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, signal.SIGKILL)


# ---- traffic ------------------------------------------------------------------------------------


@dataclass
class Tally:
    outcomes: Counter[str] = field(default_factory=Counter)
    by_kind: Counter[str] = field(default_factory=Counter)
    latencies: list[float] = field(default_factory=list)
    examples: dict[str, str] = field(default_factory=dict)

    def add(self, kind: str, outcome: str, latency: float | None, detail: str = "") -> None:
        self.outcomes[outcome] += 1
        self.by_kind[f"{kind}:{outcome}"] += 1
        if latency is not None:
            self.latencies.append(latency)
        if detail and outcome not in self.examples:
            self.examples[outcome] = detail[:300]


def _body(kind: str, rng: random.Random, max_new: int) -> tuple[str, dict[str, Any], bool]:
    words = " ".join(rng.choice(("alpha", "beta", "gamma", "delta", "tea")) for _ in range(24))
    params = {"max_new_tokens": max_new, "temperature": 0, "ignore_eos": True}
    if kind in ("generate", "abort"):
        return "/generate", {"text": words, "sampling_params": params}, False
    if kind in ("generate_stream", "stream_disconnect"):
        return "/generate", {"text": words, "sampling_params": params, "stream": True}, True
    if kind == "completions_n2_logprobs":
        body = {"prompt": words, "max_tokens": max_new, "n": 2, "logprobs": 2}
        return "/v1/completions", body, False
    body = {"messages": [{"role": "user", "content": words}],
            "max_tokens": max_new, "stop": ["\n"], "stream": True}  # fmt: skip
    return "/v1/chat/completions", body, True


async def _stream(client: httpx.AsyncClient, url: str, body: dict[str, Any], leave: bool) -> str:
    """One streamed request; its outcome."""
    async with client.stream("POST", url, json=body) as resp:
        if resp.status_code != 200:
            return f"failed_before_first_byte:{resp.status_code}"
        events, error, done = 0, False, False
        try:
            async for line in resp.aiter_lines():
                if not line.startswith("data: "):
                    continue
                if line == "data: [DONE]":
                    done = True
                    break
                events += 1
                error = error or "error" in json.loads(line[6:])
                if leave and events >= 2:
                    return "left_by_client"
        except httpx.HTTPError:
            return "failed_after_first_byte:unclean"
        if error:
            return "failed_after_first_byte:clean" if done else "failed_after_first_byte:unclean"
        return "completed" if done else "failed_after_first_byte:unclean"


async def one_request(
    client: httpx.AsyncClient, router: str, kind: str, rng: random.Random, max_new: int
) -> tuple[str, float, str]:
    route, body, streamed = _body(kind, rng, max_new)
    start = time.monotonic()
    try:
        if streamed:
            outcome = await _stream(client, router + route, body, kind == "stream_disconnect")
            return outcome, time.monotonic() - start, ""
        timeout = 0.3 if kind == "abort" else None
        resp = await client.post(router + route, json=body, timeout=timeout or client.timeout)
        if resp.status_code == 200:
            return "completed", time.monotonic() - start, ""
        return f"failed_before_first_byte:{resp.status_code}", 0.0, resp.text
    except httpx.TimeoutException as exc:
        if kind == "abort":
            return "left_by_client", 0.0, ""
        return "failed_before_first_byte:timeout", 0.0, repr(exc)
    except httpx.HTTPError as exc:
        return "failed_before_first_byte:transport", 0.0, repr(exc)


async def drive(args: argparse.Namespace, router: str, stop_at: float, tally: Tally) -> None:
    rng = random.Random(args.seed)
    sent = 0
    limits = httpx.Limits(max_connections=args.concurrency * 2)
    async with httpx.AsyncClient(timeout=300, limits=limits) as client:

        async def worker() -> None:
            nonlocal sent
            while time.monotonic() < stop_at and sent < args.max_requests:
                sent += 1
                kind = KINDS[sent % len(KINDS)]
                outcome, latency, detail = await one_request(
                    client, router, kind, rng, args.max_new_tokens
                )
                tally.add(kind, outcome, latency if outcome == "completed" else None, detail)

        await asyncio.gather(*(worker() for _ in range(args.concurrency)))


# ---- the run ------------------------------------------------------------------------------------


def _killer(
    args: argparse.Namespace, replicas: list[Replica], stop: threading.Event, log: list[str]
) -> None:
    """Every kill_every_s: SIGKILL the next replica's whole tree, start it again, wait."""
    i = 0
    while not stop.wait(args.kill_every_s):
        idx = i % len(replicas)
        kill_tree(replicas[idx].proc.pid)
        replicas[idx].proc.wait(10)
        t0 = time.monotonic()
        replicas[idx] = start_replica(args, idx)
        try:
            wait_ready_replicas([replicas[idx]])
            log.append(f"replica {idx} killed and back in {time.monotonic() - t0:.1f}s")
        except RuntimeError as exc:
            log.append(f"replica {idx} did not come back: {exc}")
        i += 1


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _idle_usage(replicas: list[Replica]) -> dict[str, float]:
    out: dict[str, float] = {}
    for r in replicas:
        deadline = time.monotonic() + 60
        usage = -1.0
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError, ValueError, KeyError):
                load = httpx.get(r.url + "/get_load", timeout=5).json()
                usage = float(load["token_usage"])
                if load["num_reqs"] == 0 and usage == 0:
                    break
            time.sleep(0.5)
        out[r.url] = usage
    return out


def run_soak(args: argparse.Namespace) -> int:
    replicas = [start_replica(args, i) for i in range(args.replicas)]
    router_proc: subprocess.Popen[bytes] | None = None
    try:
        wait_ready_replicas(replicas)
        router = f"http://127.0.0.1:{args.router_port}"
        log_path = Path(args.log_dir) / "router.log"
        cmd = [
            _console_script(),
            "router",
            "--port",
            str(args.router_port),
            "--health-check-interval-s",
            "1",
            "--worker-urls",
            *(r.url for r in replicas),
            *shlex.split(args.router_args),
        ]
        with log_path.open("wb") as log:  # fmt: skip
            router_proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        _wait_router(router, len(replicas))
        start_usage = _usages(replicas, router_proc)
        tally, stop = Tally(), threading.Event()
        events: list[str] = []
        killer = threading.Thread(target=_killer, args=(args, replicas, stop, events))
        if args.kill_every_s > 0:
            killer.start()
        t0 = time.monotonic()
        asyncio.run(drive(args, router, t0 + args.duration_s, tally))
        elapsed = time.monotonic() - t0
        stop.set()
        if killer.is_alive():
            killer.join()
        kv = _idle_usage(replicas)
        end_usage = _usages(replicas, router_proc)
        return _report(args, tally, events, kv, start_usage, end_usage, elapsed)
    finally:
        if router_proc is not None and router_proc.poll() is None:
            router_proc.send_signal(signal.SIGINT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                router_proc.wait(10)
        stop_replicas(replicas)


def _wait_router(url: str, healthy: int) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError, ValueError):
            resp = httpx.get(url + "/readiness", timeout=2)
            if resp.status_code == 200 and resp.json().get("healthy_workers", 0) >= healthy:
                return
        time.sleep(0.5)
    raise RuntimeError("router not ready")


def _usages(replicas: list[Replica], router: subprocess.Popen[bytes]) -> dict[str, Any]:
    out = {f"engine {r.index}": tree_usage(r.proc.pid) for r in replicas}
    out["router"] = tree_usage(router.pid)
    return out


def _report(  # noqa: PLR0913 - one report of one run
    args: argparse.Namespace,
    tally: Tally,
    events: list[str],
    kv: dict[str, float],
    start: dict[str, Any],
    end: dict[str, Any],
    elapsed: float,
) -> int:
    o = tally.outcomes
    before = sum(v for k, v in o.items() if k.startswith("failed_before_first_byte"))
    unclean = o["failed_after_first_byte:unclean"]
    summary = {
        "duration_s": round(elapsed, 1),
        "sent": sum(o.values()),
        "completed": o["completed"],
        "left_by_client": o["left_by_client"],
        "failed_before_first_byte": before,
        "failed_after_first_byte_clean": o["failed_after_first_byte:clean"],
        "failed_after_first_byte_unclean": unclean,
        "p50_s": round(_percentile(tally.latencies, 0.5), 3),
        "p99_s": round(_percentile(tally.latencies, 0.99), 3),
        "kills": len(events),
        "kv_token_usage_at_end": kv,
    }
    print_table("soak", [summary], [k for k in summary if k != "kv_token_usage_at_end"])
    rows = [{"process": k, **{f"start_{m}": v for m, v in start[k].items()},
             **{f"end_{m}": v for m, v in end.get(k, {}).items()}} for k in start]  # fmt: skip
    print_table("processes", rows, list(rows[0]))
    for line in events:
        print(f"  {line}")
    print(f"  KV token usage at the end: {kv}")
    if tally.examples:
        print(f"  first example of each failure: {tally.examples}")
    write_json(
        args.output,
        {
            "summary": summary,
            "outcomes": dict(tally.by_kind),
            "processes": rows,
            "events": events,
            "examples": tally.examples,
        },
    )
    ok = before == 0 and unclean == 0 and all(v == 0 for v in kv.values())
    return 0 if ok else 1
