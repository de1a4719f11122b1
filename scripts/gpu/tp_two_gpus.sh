#!/usr/bin/env bash
# Tensor parallelism on two GPUs, the real NCCL between two processes. NOT a step of all.sh: its
# calls lend one GPU, and one GPU cannot run two NCCL ranks (the README's GPU table says "not run
# (needs 2 GPUs)"). SmolLM2 materialized for two ranks (each recorded on its own GPU), then a
# restored two-rank start (`--require-artifact`: every rank restores, or the start fails) against
# a normal two-rank start: the same answer, or the check fails. One GPU's answer is printed
# beside them, and the transport NCCL chose between the ranks (each rank sees its GPU alone). On a
# machine with two GPUs, after scripts/gpu/all.sh installed Medusa and joined SmolLM2:
#   bash scripts/gpu/tp_two_gpus.sh
# CUDA_VISIBLE_DEVICES: the two GPUs (default 0,1; indices or UUIDs); MEDUSA_GPU_MODEL: smollm2
# (default) or a .gguf file.
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/gpu/lib/require.sh
require_medusa cuda
model=$(require_model)
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
if [ "${gpus:-0}" -lt 2 ]; then
  echo "skipped: needs 2 GPUs, this machine has ${gpus:-0} (one GPU cannot run two NCCL ranks)"
  exit 0
fi
export MEDUSA_DEVICE=cuda CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0,1}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
export NCCL_DEBUG=INFO NCCL_DEBUG_FILE="$out/nccl.%h.%p.log"
ask=(--demo "What is the capital of France?")
medusa materialize "$model" --tensor-parallel-size 2 --out "$out/tp2"
medusa run "$model" --tensor-parallel-size 2 --port 8196 "${ask[@]}" | tee "$out/normal.txt"
medusa run "$model" --artifact "$out/tp2" --require-artifact --port 8195 "${ask[@]}" \
  | tee "$out/restored.txt"
CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES%%,*} medusa run "$model" --port 8194 "${ask[@]}" \
  | tee "$out/one.txt"
answer() { grep '^assistant:' "$out/$1.txt"; }
grep -q 'graph_restore' "$out/restored.txt" && ! grep -q 'graph_capture' "$out/restored.txt" \
  || { echo "tp_two_gpus: the restored start captured its graphs (its ready line, above)"; exit 1; }
[ "$(answer restored)" = "$(answer normal)" ] \
  || { echo "tp_two_gpus: the restored two-rank start answered differently (above)"; exit 1; }
one="differs"
[ "$(answer one)" = "$(answer normal)" ] && one="the same"
via=$(cat "$out"/nccl.*.log 2>/dev/null | grep -o ' via [A-Za-z0-9/_]*' | sort -u | tr -d '\n' \
  || true)
echo "tp_two_gpus: identical answers, restored two-rank start vs normal two-rank start;" \
  "one GPU's answer: $one; NCCL between the ranks:${via:- (no transport line logged)}"
