#!/usr/bin/env bash
# MLA decode, the CPU fast path against the PyTorch reference (issue 30): a random-weight model
# with DeepSeek-V2-Lite's attention shapes (hidden 2048, 16 heads, kv_lora_rank 512, rope 64,
# nope 128, v 128, no q_lora_rank) and a smaller MoE (4 layers, 8 experts top-2, 2 shared, the
# first layer dense, vocab 32k), written by transformers in bfloat16; then `bench one-batch`
# with each attention backend on the same batch. docs/benchmarks.md has the numbers.
#   scripts/bench_mla.sh            (this checkout's venv; an idle machine; ~4 minutes)
set -euo pipefail
out=${OUT:-bench-results/mla}
model=$out/v2lite-shaped
mkdir -p "$out"
if [[ ! -f $model/config.json ]]; then
    python - "$model" <<'PY'
import sys
from pathlib import Path

import torch
import transformers as tf

from tests.engine.models.tiny import _save_tokenizer

folder = Path(sys.argv[1])
config = tf.DeepseekV2Config(
    vocab_size=32000, hidden_size=2048, num_hidden_layers=4, num_attention_heads=16,
    num_key_value_heads=16, intermediate_size=4096, moe_intermediate_size=1408,
    n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=2, first_k_dense_replace=1,
    n_group=1, topk_group=1, topk_method="greedy", q_lora_rank=None, kv_lora_rank=512,
    qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128, max_position_embeddings=8192,
    rope_parameters={
        "rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
        "original_max_position_embeddings": 2048, "mscale": 0.707, "mscale_all_dim": 0.707,
        "beta_fast": 32, "beta_slow": 1,
    },
)
torch.manual_seed(0)
tf.DeepseekV2ForCausalLM(config).to(torch.bfloat16).eval().save_pretrained(str(folder))
_save_tokenizer(folder)
PY
fi
for backend in grouped torch; do
    radixserve bench one-batch --model-path "$model" --dtype bfloat16 \
        --attention-backend "$backend" --batch-size "${BATCH:-8}" --input-len "${INPUT:-512}" \
        --output-len "${OUTPUT:-32}" --output-file "$out/$backend.json"
done
