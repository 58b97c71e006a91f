#!/usr/bin/env bash
# Tier-aware routing over HiCache (docs/hicache.md, docs/router.md, issue 29): three engine
# replicas with small KV pools, a host tier each and one shared file storage folder, behind
# the router, on many tenants' system prompts revisited in random order. Two router runs on
# the same traffic, each over freshly started engines and an empty storage folder:
#   aware   --cache-tier-credit host=0.75,storage=0.5 (the default)
#   blind   --cache-tier-credit host=0,storage=0      (only the KV pools count)
# Reports, per run and sample, the engine-reported cached-token ratio (meta_info.cached_tokens,
# which counts prefixes loaded back from host or storage), mean / p99 TTFT and throughput, and
# per run the engines' prefix hits by tier (their /metrics, summed over the three).
#
#   scripts/bench_hicache_router.sh     (this checkout's `radixserve` on PATH; an idle machine)
set -euo pipefail
POOL=${POOL:-2048}
TENANTS=${TENANTS:-12}
SYSTEM_LEN=${SYSTEM_LEN:-1024}
PER_TENANT=${PER_TENANT:-4}
IN_FLIGHT=${IN_FLIGHT:-3}
SAMPLES=${SAMPLES:-3}
out=bench-results/hicache-router
mkdir -p "$out"
store=$(mktemp -d)
pgids=()
stop_all() {
    for g in "${pgids[@]}"; do kill -- -"$g" 2>/dev/null || true; done
    for g in "${pgids[@]}"; do while kill -0 -- -"$g" 2>/dev/null; do sleep 1; done; done
    pgids=()
}
trap 'stop_all; rm -rf "$store"' EXIT

ready() {  # URL PATH
    for _ in $(seq 600); do curl -sf "$1$2" >/dev/null && return 0; sleep 1; done
    echo "$1 not ready" >&2
    return 1
}

run() {  # NAME CREDIT
    local name=$1 credit=$2 urls=()
    rm -rf "${store:?}"/* "$store"/.storage-id
    for i in 0 1 2; do
        local port=$((30830 + i)) kv=$((30850 + 2 * i))
        setsid radixserve serve --port "$port" --kv-events-port "$kv" --page-size 16 \
            --max-total-tokens "$POOL" --enable-hierarchical-cache --hicache-ratio 2 \
            --hicache-storage-backend file \
            --hicache-storage-backend-extra-config "{\"file_storage_path\": \"$store\"}" \
            >"$out/$name-engine$i.log" 2>&1 &
        pgids+=($!)
        urls+=("http://127.0.0.1:$port")
    done
    for u in "${urls[@]}"; do ready "$u" /health; done
    setsid radixserve router --port 30840 --worker-urls "${urls[@]}" \
        --cache-tier-credit "$credit" >"$out/$name-router.log" 2>&1 &
    pgids+=($!)
    ready http://127.0.0.1:30840 /readiness
    for s in $(seq "$SAMPLES"); do
        radixserve bench serving --base-url http://127.0.0.1:30840 \
            --dataset-name generated-shared-prefix --num-prompts $((TENANTS * PER_TENANT)) \
            --gsp-num-groups "$TENANTS" --gsp-prompts-per-group "$PER_TENANT" \
            --gsp-system-prompt-len "$SYSTEM_LEN" --gsp-question-len 32 --gsp-output-len 16 \
            --max-concurrency "$IN_FLIGHT" --seed "$s" \
            --output-file "$out/$name-sample$s.json" >/dev/null
    done
    for i in 0 1 2; do curl -sf "${urls[$i]}/metrics" >"$out/$name-engine$i.metrics"; done
    stop_all
}

run aware host=0.75,storage=0.5
run blind host=0,storage=0

python - "$out" "$SAMPLES" <<'PY'
import json
import sys
from pathlib import Path

out, samples = Path(sys.argv[1]), int(sys.argv[2])
print("| routing | sample | cached-token ratio | mean TTFT ms | p99 TTFT ms | output tok/s |")
print("|---|---|---|---|---|---|")
for name in ("aware", "blind"):
    for s in range(1, samples + 1):
        r = json.loads((out / f"{name}-sample{s}.json").read_text())["results"]
        print(f"| {name} | {s} | {r['cache_hit_rate']:.3f} | {r['mean_ttft_ms']:.0f} "
              f"| {r['p99_ttft_ms']:.0f} | {r['output_throughput']:.1f} |")
from prometheus_client.parser import text_string_to_metric_families

for name in ("aware", "blind"):
    tiers = {}
    for i in range(3):
        text = (out / f"{name}-engine{i}.metrics").read_text()
        for fam in text_string_to_metric_families(text):
            for sample in fam.samples:
                if sample.name == "radixserve:hicache_hit_tokens_total":
                    tier = sample.labels["tier"]
                    tiers[tier] = tiers.get(tier, 0) + int(sample.value)
    print(f"{name}: prefix hits by tier (tokens, 3 engines): {tiers}")
PY
