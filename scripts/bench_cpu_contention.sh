#!/usr/bin/env bash
# Our server on cores it shares with another busy process (a "hog": one Python busy loop per
# HOGS, default 1), against the same server on idle cores, under several OpenMP wait settings.
# It measures what a core taken away costs: libgomp's threads spin at each barrier before they
# sleep, and a thread spinning for a partner that lost its core burns the core that partner
# needs (docs/benchmarks.md, "Cores shared with another process").
#
#   scripts/bench_cpu_contention.sh [ROUNDS]  (2)
#   HOGS=0 measures each variant twice on idle cores (the "hog" columns then have no hog)
#   VARIANTS="libgomp:GOMP_SPINCOUNT=300000 ours: passive:OMP_WAIT_POLICY=PASSIVE" (the default
#   list: NAME:ENV pairs, ENV a comma-separated list of VAR=VALUE, empty for none)
#
# Each round runs every variant, in reverse order in even rounds: a fresh server, then
# (a) 1 × 128 → 64 and c16 random 256 → 64 (32 requests, 16 in flight) on idle cores, then
# both again with the hogs running (short: with libgomp's default spin a hog slows a step ~70×). Needs this checkout's `radixserve` on PATH. Writes
# bench-results/contention/round<N>-<variant>-<idle|hog>-<a|c16>.json and prints the means.
set -euo pipefail
rounds=${1:-2}
variants=${VARIANTS:-"libgomp:GOMP_SPINCOUNT=300000 ours: passive:OMP_WAIT_POLICY=PASSIVE"}
hogs=${HOGS:-1}
out=bench-results/contention
port=30802
url=http://127.0.0.1:$port
mkdir -p "$out"

pgid="" hog_pids=()
stop_all() {
    for pid in "${hog_pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    hog_pids=()
    [[ -n $pgid ]] || return 0
    kill -- -"$pgid" 2>/dev/null || true
    while kill -0 -- -"$pgid" 2>/dev/null; do sleep 1; done
    pgid=""
}
trap stop_all EXIT

workloads() {  # FILE_PREFIX SEED (each phase its own prompts: no prefix-cache hits)
    local bench=(radixserve bench serving --backend openai --base-url "$url" --dataset-name random
        --random-range-ratio 1 --seed "$2")
    "${bench[@]}" --num-prompts 1 --random-input-len 128 --random-output-len 64 \
        --output-file "$1-a.json" >/dev/null
    "${bench[@]}" --num-prompts 32 --max-concurrency 16 --random-input-len 256 \
        --random-output-len 64 --output-file "$1-c16.json" >/dev/null
}

run_variant() {  # ROUND NAME ENV
    local envs=() prefix="$out/round$1-$2"
    [[ -n $3 ]] && IFS=, read -ra envs <<<"$3"
    setsid env "${envs[@]}" radixserve serve --port $port >"$prefix.log" 2>&1 &
    pgid=$!
    for _ in $(seq 300); do curl -sf "$url/health" >/dev/null && break; sleep 1; done
    workloads "$prefix-idle" 1
    for _ in $(seq "$hogs"); do
        python3 -c "while True: pass" &
        hog_pids+=($!)
    done
    workloads "$prefix-hog" 2
    stop_all
}

read -ra list <<<"$variants"
for r in $(seq "$rounds"); do
    order=("${list[@]}")
    if ((r % 2 == 0)); then
        order=()
        for ((i = ${#list[@]} - 1; i >= 0; i--)); do order+=("${list[i]}"); done
    fi
    for v in "${order[@]}"; do
        echo "round $r: ${v%%:*}" >&2
        run_variant "$r" "${v%%:*}" "${v#*:}"
    done
done

python3 - "$out" "$rounds" "${list[@]}" <<'PY'
import json
import sys
from pathlib import Path

out, rounds, names = Path(sys.argv[1]), int(sys.argv[2]), [v.split(":")[0] for v in sys.argv[3:]]


def mean(name: str, cond: str, work: str, key: str) -> float:
    vals = [json.loads((out / f"round{r}-{name}-{cond}-{work}.json").read_text())["results"][key]
            for r in range(1, rounds + 1)]
    return sum(vals) / len(vals)


print("variant | idle (a) tok/s | idle c16 tok/s, TPOT ms | hog (a) tok/s | hog c16 tok/s, TPOT ms")
for n in names:
    cells = []
    for cond in ("idle", "hog"):
        cells.append(f"{mean(n, cond, 'a', 'output_throughput'):.1f}")
        c16 = mean(n, cond, "c16", "output_throughput"), mean(n, cond, "c16", "mean_tpot_ms")
        cells.append(f"{c16[0]:.1f}, {c16[1]:.1f}")
    print(f"{n} | " + " | ".join(cells))
PY
