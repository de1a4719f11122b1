#!/usr/bin/env bash
# Materializes a model on a real GPU (the engine's CUDA kernels; mblas's hidden kernel), restores
# it in a fresh process with --validate, and compares cold-start stages and answers with a normal
# start; then serves while loading (each layer waits for its own weights, the default on a GPU)
# and compares again, and times it against waiting for the whole load. On a machine with a GPU,
# after scripts/gpu/all.sh installed Medusa:
#   bash scripts/gpu/restore_parity.sh
# MEDUSA_GPU_MODEL: smollm2 (default) or a .gguf file (all.sh's tiny random Llama in its first
# call); MEDUSA_GPU_REPEAT: starts of each kind in the benches (default 3);
# MEDUSA_GPU_SERVE_BENCH=0: no serve-while-loading bench (a tiny model's load is too short to overlap).
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/gpu/lib/require.sh
require_medusa cuda
model=$(require_model)
repeat=${MEDUSA_GPU_REPEAT:-3}
export MEDUSA_DEVICE=cuda
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
ask=(--demo "What is the capital of France?")
medusa materialize "$model" --out "$out/art"
python scripts/bench/coldstart.py --model "$model" --repeat "$repeat"
medusa run "$model" --artifact "$out/art" --validate --require-artifact --port 8199 "${ask[@]}" \
  | tee "$out/restored.txt"
medusa run "$model" --port 8198 "${ask[@]}" | tee "$out/normal.txt"
same() {  # the answers of two starts, or the check fails
  diff <(grep '^assistant:' "$out/$1.txt") <(grep '^assistant:' "$out/normal.txt") \
    || { echo "restore_parity: the $1 start answered differently (above)"; exit 1; }
}
same restored && echo "restore_parity: identical answers, restored start-up validated"
medusa run "$model" --artifact "$out/art" --require-artifact --serve-while-loading --port 8197 \
  "${ask[@]}" | tee "$out/gated.txt"
same gated && echo "restore_parity: identical answers served while loading"
[ "${MEDUSA_GPU_SERVE_BENCH:-1}" = 0 ] \
  || python scripts/bench/serve_while_loading.py --model "$model" --repeat "$repeat"
