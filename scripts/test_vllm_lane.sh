#!/usr/bin/env bash
# The optional vLLM test lane: a venv with the `vllm` extra beside the installed medusa, then the
# plugin tests against the real vLLM. CPU only; vLLM's media extras built for CUDA torch are
# removed so that vLLM imports on torch's CPU build.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${VLLM_LANE_VENV:-/tmp/medusa-vllm-lane}
python -m venv --system-site-packages "$venv"
"$venv/bin/pip" install -q "vllm>=0.32,<0.33" torch==2.13.0
"$venv/bin/pip" uninstall -y -q torchvision torchaudio torchcodec || true
"$venv/bin/python" -m pytest -q tests/integrations
