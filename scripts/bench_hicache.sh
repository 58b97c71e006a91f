#!/usr/bin/env bash
# The HiCache workload (docs/hicache.md, issue 29): many tenants' system prompts whose total is
# several times the KV pool, revisited in random order. Four servers, one at a time, each fresh,
# on the same traffic (SAMPLES samples, each a new set of tenants, run back to back):
#   none      the KV pool of POOL tokens, no tiers (evicted prefixes are recomputed)
#   host      the same pool + a host tier of HOST_RATIO x the pool
#   storage   the same pool + a host tier of 1 x the pool + a file storage tier
#   big-pool  no tiers, one KV pool as large as pool + host of `host` (the same total)
# Traffic: `bench serving` generated-shared-prefix, TENANTS system prompts of SYSTEM_LEN tokens,
# PER_TENANT questions each (QUESTION_LEN tokens, OUTPUT_LEN output), all shuffled, IN_FLIGHT
# requests in flight (a closed loop). Reports, per server and sample, the cached-token ratio,
# mean and p99 TTFT and output throughput, then the load-back and prefill cost per token.
#
#   scripts/bench_hicache.sh            (this checkout's `radixserve` on PATH; an idle machine)
#   SERVERS="storage big-pool" scripts/bench_hicache.sh    (some of the four only)
set -euo pipefail
POOL=${POOL:-4096}
HOST_RATIO=${HOST_RATIO:-4}
TENANTS=${TENANTS:-16}
SYSTEM_LEN=${SYSTEM_LEN:-1024}
PER_TENANT=${PER_TENANT:-4}
QUESTION_LEN=${QUESTION_LEN:-32}
OUTPUT_LEN=${OUTPUT_LEN:-16}
IN_FLIGHT=${IN_FLIGHT:-2}
SAMPLES=${SAMPLES:-3}
PAGE=${PAGE:-16}
out=bench-results/hicache
port=30820
mkdir -p "$out"
store=$(mktemp -d)

server_pgid=""
stop_server() {
    [[ -n $server_pgid ]] || return 0
    kill -- -"$server_pgid" 2>/dev/null || true
    while kill -0 -- -"$server_pgid" 2>/dev/null; do sleep 1; done
    server_pgid=""
}
trap 'stop_server; rm -rf "$store"' EXIT

wait_ready() {
    for _ in $(seq 600); do
        curl -sf "http://127.0.0.1:$port/v1/models" >/dev/null && return 0
        kill -0 "$server_pgid" 2>/dev/null || { echo "server exited" >&2; return 1; }
        sleep 1
    done
    return 1
}

run() {  # NAME FLAGS...
    local name=$1; shift
    rm -rf "${store:?}"/*
    setsid radixserve serve --port "$port" --page-size "$PAGE" "$@" >"$out/$name.log" 2>&1 &
    server_pgid=$!
    wait_ready
    for s in $(seq "$SAMPLES"); do
        radixserve bench serving --base-url "http://127.0.0.1:$port" \
            --dataset-name generated-shared-prefix --num-prompts $((TENANTS * PER_TENANT)) \
            --gsp-num-groups "$TENANTS" --gsp-prompts-per-group "$PER_TENANT" \
            --gsp-system-prompt-len "$SYSTEM_LEN" --gsp-question-len "$QUESTION_LEN" \
            --gsp-output-len "$OUTPUT_LEN" --max-concurrency "$IN_FLIGHT" --seed "$s" \
            --output-file "$out/$name-sample$s.json" >/dev/null
    done
    sleep 2  # the storage writer drains; then the pools should be at rest
    curl -sf "http://127.0.0.1:$port/metrics" >"$out/$name.metrics"
    du -sb "$store" | cut -f1 >"$out/$name.storage-bytes"
    stop_server
}

for server in ${SERVERS:-none host storage big-pool}; do
    case $server in
        none) run none --max-total-tokens "$POOL" ;;
        host) run host --max-total-tokens "$POOL" --enable-hierarchical-cache \
            --hicache-ratio "$HOST_RATIO" ;;
        storage) run storage --max-total-tokens "$POOL" --enable-hierarchical-cache \
            --hicache-ratio 1 --hicache-storage-backend file \
            --hicache-storage-backend-extra-config "{\"file_storage_path\": \"$store\"}" ;;
        big-pool) run big-pool --max-total-tokens $((POOL * (1 + HOST_RATIO))) ;;
    esac
done

python - "$out" "$SAMPLES" ${SERVERS:-none host storage big-pool} <<'PY'
import json
import sys
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

out, samples, servers = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
print("| server | sample | cached-token ratio | mean TTFT ms | p99 TTFT ms | output tok/s |")
print("|---|---|---|---|---|---|")
for name in servers:
    for s in range(1, samples + 1):
        r = json.loads((out / f"{name}-sample{s}.json").read_text())["results"]
        print(f"| {name} | {s} | {r['cache_hit_rate']:.3f} | {r['mean_ttft_ms']:.0f} "
              f"| {r['p99_ttft_ms']:.0f} | {r['output_throughput']:.1f} |")
for name in [s for s in servers if s in ("host", "storage")]:
    values = {}
    for fam in text_string_to_metric_families((out / f"{name}.metrics").read_text()):
        for sample in fam.samples:
            values.setdefault(sample.name, 0.0)
            values[sample.name] += sample.value
    tokens = values.get("radixserve:load_back_tokens_total", 0.0)
    secs = values.get("radixserve:load_back_duration_seconds_total", 0.0)
    if tokens:
        print(f"{name}: loaded back {tokens:.0f} tokens in {secs:.2f} s "
              f"({secs / tokens * 1e6:.1f} us/token)")
    at_rest = {k.removeprefix("radixserve:"): int(v) for k, v in values.items() if k in (
        "radixserve:prefetched_tokens_total", "radixserve:storage_prefetch_deferrals_total",
        "radixserve:hicache_host_used_tokens", "radixserve:hicache_host_total_tokens",
        "radixserve:hicache_storage_write_queue_depth", "radixserve:hicache_prefetch_staged_bytes",
        "radixserve:num_running_reqs", "radixserve:num_queue_reqs",
    )}
    stored = int((out / f"{name}.storage-bytes").read_text())
    print(f"{name}: after the run {at_rest}; storage folder {stored} bytes")
PY
