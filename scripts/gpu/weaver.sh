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
# The tests stop at the first failure (-x) and print its reason (-rfE). A test that hangs is
# stopped after $per_test s with every thread's stack (pytest-timeout's thread method, which
# also stops a test stuck in a CUDA call); should the tests together near this step's bound
# (all.sh's MEDUSA_GPU_STEP_BOUND), SIGABRT makes pytest and its receivers print their Python
# stacks (faulthandler) before it ends them. --capture=sys: a receiver's stderr goes straight to
# this log, even from a process that is killed.
per_test=30
left=$(( ${MEDUSA_GPU_STEP_BOUND:-75} - SECONDS - 5 ))
[ "$left" -ge 10 ] || left=10  # (timeout 0 would mean no bound at all)
python -c 'import pytest_timeout' 2>/dev/null || {
  echo "FAIL: pytest-timeout is not importable by $(command -v python) (the image has it)"; exit 1; }
# The tests' exchange regions go in /dev/shm (tests/conftest.py: a region on a disk filesystem
# cannot be registered for device writes); where it is missing they fall back to the temp dir.
echo "exchange regions: /dev/shm is $(stat -f -c %T /dev/shm 2>/dev/null || echo missing)," \
  "the temp dir ${TMPDIR:-/tmp} is $(stat -f -c %T "${TMPDIR:-/tmp}" 2>/dev/null || echo missing)"
rc=0
MEDUSA_DEVICE=cuda PYTHONFAULTHANDLER=1 timeout -s ABRT -k 3 "$left" python -m pytest -q \
  -p no:cacheprovider -x -rfE --capture=sys --timeout="$per_test" --timeout-method=thread \
  tests/weaver/test_exchange.py tests/weaver/test_engine_weaving.py 2>&1 | tee "$out/pytest.log" \
  || rc=$?
if [ "$rc" != 0 ]; then
  case $rc in
    124 | 134 | 137) why="stopped after ${left} s, near the step's bound: the stacks above" ;;
    *) why=$(grep -m1 -E '^(FAILED|ERROR) ' "$out/pytest.log" \
             || grep -m1 -E '^E  ' "$out/pytest.log" \
             || { grep -q -- '+ Timeout +' "$out/pytest.log" && echo "a test ran past $per_test s: the stacks above"; } \
             || echo "pytest exit $rc") ;;
  esac
  echo "FAIL: weaver engine tests on cuda: $why"
  exit 1
fi
echo "weaver engine tests on cuda: ok"
