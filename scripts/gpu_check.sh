#!/usr/bin/env bash
# The prepared GPU check (issue 13): run on one borrowed GPU (H200 target: < 8 minutes).
#
#   1. the gpu-marked tests: every Triton kernel against its PyTorch reference at real shapes
#      (tests/kernels, incl. the fused norm / SiLU / rotary / MoE ops against the engine's
#      PyTorch layers), the triton backend (+ those ops) against torch end to end, FlashInfer
#      parity (skips without flashinfer), CUDA-graph replay = eager (tests/engine/attention);
#   2. python -m radixserve.bench.gpu_check: copy bandwidth, SmolLM2 greedy parity per backend
#      (eager / graphs; triton with and without the fused ops), decode tok/s of an 8B-shaped
#      random Llama at batch 1, 8, 64 with context 1024 (eager, graphs) against the HBM
#      roofline and transformers' generate;
#   3. a short summary, printed last.
#
# Needs python with torch + triton (CUDA), transformers, pytest and the project's pure-Python
# dependencies; the sources are used in place (PYTHONPATH), nothing is installed. Logs and a
# JSON of every number go to $OUT (the device tool's output folder) or /tmp/gpu_check.
# Env: PYTHON (default: .venv/bin/python if present, else python3), GPU_CHECK_ARGS (extra
# arguments for the python check, e.g. "--steps 16" or "--no-hf").
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/gpu_check}
mkdir -p "$out"
py=${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}
export PYTHONPATH="common:engine:kernels:router:operator:.${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
start=$(date +%s)
# What scripts/gpu_carry.sh prepared (carried folders): the engine's missing wheels, SmolLM2.
if compgen -G ".gpu_wheels/*.whl" >/dev/null; then
    "$py" -m pip install -q --no-index --no-deps --target /tmp/gpu_site .gpu_wheels/*.whl \
        && export PYTHONPATH="/tmp/gpu_site:$PYTHONPATH"
fi
parity=()
if [ -f .gpu_model_a/smollm2.gguf.part0 ] && [ -f .gpu_model_b/smollm2.gguf.part1 ]; then
    cat .gpu_model_a/smollm2.gguf.part0 .gpu_model_b/smollm2.gguf.part1 >/tmp/smollm2-135m.gguf
    parity=(--parity-model /tmp/smollm2-135m.gguf)
fi

echo "== environment"
"$py" - <<'PY' 2>&1 | tee "$out/env.txt"
import importlib, importlib.util
import torch
print("torch", torch.__version__, "cuda", torch.version.cuda, "device",
      torch.cuda.get_device_name() if torch.cuda.is_available() else "NONE")
for name in ("triton", "flashinfer", "transformers", "pytest", "msgspec", "safetensors", "gguf"):
    spec = importlib.util.find_spec(name)
    print(name, getattr(importlib.import_module(name), "__version__", "?") if spec else "MISSING")
import radixserve.engine  # noqa: F401  (fails here, naming the missing module, if deps lack)
print("radixserve.engine imports")
PY
[ "${PIPESTATUS[0]}" -eq 0 ] || { echo "environment check failed (see above)"; exit 2; }

echo "== gpu-marked tests (kernels at real shapes, backends, graphs)"
timeout 240 "$py" -m pytest -q -m gpu -p no:cacheprovider tests/kernels \
    tests/engine/attention/test_triton_backend.py tests/engine/attention/test_gpu_backends.py \
    2>&1 | tee "$out/pytest.log"
tests_rc=${PIPESTATUS[0]}
tests_line=$(grep -E "[0-9]+ (passed|failed|skipped|errors?)" "$out/pytest.log" | tail -1)

echo "== parity and decode throughput"
# shellcheck disable=SC2086  # GPU_CHECK_ARGS is a list of arguments
timeout 330 "$py" -m radixserve.bench.gpu_check --output-file "$out/gpu_check.json" \
    "${parity[@]}" ${GPU_CHECK_ARGS:-} 2>&1 | tee "$out/gpu_check.log"
check_rc=${PIPESTATUS[0]}

echo
echo "================ gpu_check summary ($(( $(date +%s) - start )) s) ================"
grep -E "^torch|^triton|^flashinfer" "$out/env.txt"
echo "gpu tests (rc $tests_rc): ${tests_line:-no summary line}"
echo "python check rc $check_rc"
sed -n '/^copy bandwidth/,$p' "$out/gpu_check.log" | grep -v "^\[" || true
exit $(( tests_rc != 0 || check_rc != 0 ))
