#!/usr/bin/env bash
# Tessera's PTX access instrumentation on a real GPU: a kernel with known accesses is compiled to
# PTX, instrumented (medusa/tessera/ptx.py), run through the driver API, and the extents it
# recorded (read, written, atomic) must equal those its arguments imply. One command:
#   bash scripts/gpu/tessera_ptx.sh
# Needs nvcc and a GPU. (CI only assembles the instrumented PTX of our kernels with ptxas.)
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/gpu/lib/require.sh  # Medusa installed by scripts/gpu/all.sh; a check never installs
require_medusa
python -m medusa.tessera.ptx_check
