#!/usr/bin/env bash
# The KV size follows the device, on a real GPU: one artifact materialized with the whole device,
# then, for each amount of memory another tenant holds (a GPU's memory size is fixed: holding part
# of it stands in for a smaller slice), a profiling start beside a restored one that derives its
# block count from the artifact's recorded profiling peak (here the CUDA modules and mblas's
# workspace count in it, unlike on simcuda), and a full batch at the longest context served after
# the restore. Fails unless every derived count is within 1% or one block of the profiled one.
# On a machine with a GPU, after scripts/gpu/all.sh installed Medusa:
#   bash scripts/gpu/kv_slices.sh
# MEDUSA_GPU_MODEL: smollm2 (default) or a .gguf file (all.sh's tiny random Llama in its first
# call); MEDUSA_GPU_HELD: GiB held in turn (default 0,24,48).
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/gpu/lib/require.sh
require_medusa cuda
model=$(require_model)
export MEDUSA_DEVICE=cuda
python scripts/bench/kv_slices.py --model "$model" --held "${MEDUSA_GPU_HELD:-0,24,48}"
