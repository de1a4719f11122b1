#!/usr/bin/env bash
# HybridGEMM on a real GPU over pinned, device-mapped host weights: effective weight bandwidth and
# error for alpha 0, 0.5, 1, in the same run as cudaMemcpy of the same bytes from pinned memory
# (the host-to-device floor) and cuBLAS (torch.matmul) on device-resident weights. On a GPU machine:
#   bash scripts/gpu/hybridgemm_bandwidth.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/gpu/lib/require.sh  # Medusa installed by scripts/gpu/all.sh; a check never installs
require_medusa cuda
MEDUSA_DEVICE=cuda python scripts/gpu/hybridgemm_bandwidth.py
