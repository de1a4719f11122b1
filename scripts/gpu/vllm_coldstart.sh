#!/usr/bin/env bash
# vLLM cold start on a GPU: materialize a small model with `medusa materialize --engine vllm`, then
# start vLLM three ways (default, VLLM_ENABLE_STARTUP_PLAN=1, Medusa restore) and print the
# init-engine seconds, graph stage seconds, TPOT at batch 1 and 16, and whether greedy outputs are
# token-identical. On a machine with an NVIDIA GPU, vLLM's CUDA build and a local model:
#   MODEL=/models/Qwen2.5-0.5B-Instruct bash scripts/gpu/vllm_coldstart.sh [-- vLLM args]
set -euo pipefail
cd "$(dirname "$0")/../.."
: "${MODEL:?set MODEL to a local model directory, e.g. Qwen2.5-0.5B-Instruct}"
source scripts/gpu/lib/require.sh  # a check never installs
require_medusa
# vLLM finds the plugin through the installed package's entry point (all.sh's `pip install .`).
python -c "import vllm, torch; assert torch.cuda.is_available(), 'no CUDA device'
from importlib.metadata import entry_points
assert any(e.name == 'medusa' for e in entry_points(group='vllm.general_plugins')), \
    'the medusa vLLM plugin entry point is not installed'" || {
  echo "vllm_coldstart: needs vLLM's CUDA build and Medusa installed with its plugin entry point;" \
    "with network: pip install '.[vllm]'" >&2
  exit 3
}
export HF_HUB_OFFLINE=1
python scripts/bench/vllm_coldstart.py --model "$MODEL" "$@"
