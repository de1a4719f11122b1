#!/usr/bin/env bash
# MEDUSA's claim on code no one here wrote: a PyTorch decoder (scripts/gpu/torch_restore/decoder.py:
# Llama-shaped, random weights; cuBLAS GEMMs, torch's caching allocator, one graph pool) captures a
# decode CUDA graph per batch size; `medusa materialize --command` records it twice; a fresh process
# restores the graphs through Medusa instead of capturing and replays them on torch's current
# stream. Every stage is time-bounded (arguments go to check.py: --limits 90,240,90 are the
# seconds of the plain run, materialize and restore); nothing is installed. Last lines:
#   torch restore: bit-identical N/N graphs
#   capture vs restore per 1000 nodes: X ms vs Y ms
# Exit status 1 if any graph differs or a stage fails (named, with the end of its output); 0 with
# "skipped: ..." where there is no CUDA device. On a machine with a GPU and a CUDA torch:
#   bash scripts/gpu/torch_restore.sh [--limits P,M,R] [--work DIR]
set -uo pipefail
cd "$(dirname "$0")/../.."
py=${PYTHON:-python}
source scripts/gpu/lib/require.sh  # Medusa installed by scripts/gpu/all.sh; a check never installs
require_medusa
if ! "$py" -c 'import torch' 2>/dev/null; then
  echo "skipped: no torch in $py"
  exit 0
fi
export MEDUSA_DEVICE=cuda
exec "$py" scripts/gpu/torch_restore/check.py "$@" -- "$py" scripts/gpu/torch_restore/decoder.py
