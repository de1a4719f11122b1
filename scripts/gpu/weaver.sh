#!/usr/bin/env bash
# Weaver on a real GPU, in one command on a machine with a GPU and nvcc:
#   bash scripts/gpu/weaver.sh
# 1. Compiles csrc/kernels/cuda/weaver.cu's polling kernels into scripts/gpu/weaver_poll_check.cu
#    and runs them against an exchange region's counters in mapped host memory: a posted task is
#    seen, an idle bounded poll times out, a spinning poll sees the host's write (with latency;
#    each poll gives up after 1 s at most). This covers the kernels only: the engine does not
#    issue them (its receiver polls the region on the host, which step 2 tests).
# 2. Runs the two-process Weaver tests with MEDUSA_DEVICE=cuda (the engine's CUDA kernels, the
#    region registered with cudaHostRegister): offloaded attention bit-identical to local, the hot
#    engine's logits equal to no offload at ratios 0, 0.45, 1, a killed receiver recomputed.
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/gpu/lib/require.sh  # Medusa installed by scripts/gpu/all.sh; a check never installs
require_medusa cuda
out=$(mktemp -d)
nvcc -arch=native -O2 -Werror=all-warnings -Icsrc/kernels/cuda scripts/gpu/weaver_poll_check.cu \
  -o "$out/weaver_poll_check"
"$out/weaver_poll_check"
# NOTE: from the repository root pytest imports this checkout's Python; the kernels are the
# installed package's (built by all.sh).
MEDUSA_DEVICE=cuda python -m pytest -q -p no:cacheprovider tests/weaver/test_exchange.py \
  tests/weaver/test_engine_weaving.py
echo "weaver engine tests on cuda: ok"
