#!/usr/bin/env bash
# The weight store on a real GPU against the host-to-device floor: a restored start's weight copy
# (checked chunks through the staging ring) and cudaMemcpy of the same bytes from pinned host
# memory, GB/s side by side in one run (scripts/bench/weights.py). On a machine with a GPU, after
# scripts/gpu/all.sh installed Medusa:
#   bash scripts/gpu/weight_store.sh
# MEDUSA_GPU_MODEL: smollm2 (default; a tiny model's few MiB say nothing about bandwidth).
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/gpu/lib/require.sh
require_medusa cuda
model=$(require_model)
MEDUSA_DEVICE=cuda python scripts/bench/weights.py --model "$model" \
  --repeat "${MEDUSA_GPU_REPEAT:-3}" --variants store,copy-1,copy-pinned
