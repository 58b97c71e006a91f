#!/usr/bin/env bash
# Prefill/decode disaggregation against co-located serving at the same process count (issue 27):
# `radixserve up --prefill 1 --decode 1` against `radixserve up --replicas 2`, SmolLM2-135M with
# default flags, one CPU thread per engine, behind our router, on a workload that mixes long
# prefills (512 to 1,024 tokens) into running decodes (96 tokens each), 4 requests in flight.
# Two rounds, alternating which stack goes first. Reports throughput, TTFT and inter-token
# latency (mean and p99) from `radixserve bench serving`.
#
# On two cores this measures the plumbing (the KV hop over Mooncake's TCP transfer) and the
# interference PD removes (a decode never waits behind a prefill chunk), not GPU speed.
#   scripts/bench_pd.sh      (this checkout's `radixserve` on PATH; an idle machine; ~10 min)
set -euo pipefail
ROUNDS=${ROUNDS:-2}
PROMPTS=${PROMPTS:-32}
out=bench-results/pd
mkdir -p "$out"
pgid=
stop() {
    if [[ -n $pgid ]]; then
        kill -- -"$pgid" 2>/dev/null || true
        while kill -0 -- -"$pgid" 2>/dev/null; do sleep 1; done
    fi
    pgid=
}
trap stop EXIT

run() {  # NAME ROUND UP-FLAGS...
    local name=$1 round=$2
    shift 2
    setsid radixserve up --port 30900 --engine-base-port 30910 --kv-events-base-port 30930 \
        --threads-per-replica 1 --log-dir "$out/$name-$round-logs" "$@" \
        >"$out/$name-$round.log" 2>&1 &
    pgid=$!
    for _ in $(seq 600); do curl -sf http://127.0.0.1:30900/readiness >/dev/null && break; sleep 1; done
    radixserve bench serving --base-url http://127.0.0.1:30900 --dataset-name random \
        --num-prompts "$PROMPTS" --random-input-len 1024 --random-range-ratio 0.5 \
        --random-output-len 96 --max-concurrency 4 --seed "$round" \
        --output-file "$out/$name-$round.json" >/dev/null
    stop
}

for round in $(seq "$ROUNDS"); do
    if ((round % 2)); then order=(pd colocated); else order=(colocated pd); fi
    for name in "${order[@]}"; do
        if [[ $name == pd ]]; then run pd "$round" --prefill 1 --decode 1
        else run colocated "$round" --replicas 2; fi
    done
done

python - "$out" "$ROUNDS" <<'PY'
import json
import sys
from pathlib import Path

out, rounds = Path(sys.argv[1]), int(sys.argv[2])
cpu = next(line.split(":")[1].strip() for line in open("/proc/cpuinfo")
           if line.startswith("model name"))
print(f"CPU: {cpu}")
print("| round | stack | ok | output tok/s | mean TTFT ms | p99 TTFT ms | mean ITL ms | p99 ITL ms |")
print("|---|---|---|---|---|---|---|---|")
for r in range(1, rounds + 1):
    for name in ("pd", "colocated"):
        res = json.loads((out / f"{name}-{r}.json").read_text())["results"]
        print(f"| {r} | {name} | {res['successful']}/{res['successful'] + res['failed']} | {res['output_throughput']:.1f} | "
              f"{res['mean_ttft_ms']:.0f} | {res['p99_ttft_ms']:.0f} | "
              f"{res['mean_itl_ms']:.1f} | {res['p99_itl_ms']:.1f} |")
PY
