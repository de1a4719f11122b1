#!/usr/bin/env bash
# Runs simcuda's C test programs against the real CUDA runtime and a real GPU, and diffs what they
# print (error names, results) with what they print on simcuda. Run on a machine with a GPU:
#   bash scripts/gpu/simcuda_parity.sh
# Addresses differ by design and are filtered out; everything else must match.
#   bash scripts/gpu/simcuda_parity.sh --build-kernels DIR   # only build and check the kernels
# library into DIR (no GPU needed; CUDA_ARCH picks its code, default native).
# NOTE: `nvcc -shared` links the CUDA runtime statically: the kernels would register with a private
# runtime, and every launch through the program's libcudart by host stub would fail. The library
# is built with -cudart shared, and what it and the programs link is checked before anything runs.
# (libsimcuda.so is runtime and driver in one; on a GPU a program that calls cu* needs libcuda.)
set -euo pipefail
cd "$(dirname "$0")/../.."
cuda=${CUDA_HOME:-/usr/local/cuda}

build_kernels() {
  nvcc -arch="${CUDA_ARCH:-native}" -shared -cudart shared -Xcompiler -fPIC \
    csrc/kernels/cuda/testkernels.cu -o "$1/libgpukernels.so"
  bash scripts/gpu/lib/check_needed.sh "$1/libgpukernels.so" libcudart.so || {
    echo "FAIL: libgpukernels.so carries its own static CUDA runtime (build it with -cudart shared)"
    return 1
  }
}

if [ "${1:-}" = --build-kernels ]; then
  build_kernels "$2"
  exit
fi
source scripts/gpu/lib/require.sh  # Medusa installed by scripts/gpu/all.sh; a check never installs
require_medusa
out=$(mktemp -d)
build_kernels "$out"
libdir=$(python -c 'from medusa.cuda import paths; print(paths.lib_dir())')
# The driver's libcuda.so.1 (a toolkit's stubs/libcuda.so where the driver's has no dev link).
libcuda=-l:libcuda.so.1
ldconfig -p | grep -q 'libcuda\.so\.1 ' || libcuda="-L$cuda/lib64/stubs -lcuda"
status=0
programs=(basics capture_rules bad_input kernels copy_params event_waits)
for prog in "${programs[@]}"; do
  src=tests/cuda/programs/$prog.c
  # shellcheck disable=SC2086
  gcc -O2 -I"$cuda/include" -Icsrc/include "$src" -o "$out/$prog.gpu" \
      -L"$cuda/lib64" -L"$out" -lgpukernels -lcudart $libcuda -Wl,-rpath,"$cuda/lib64:$out"
  gcc -O2 -I"$cuda/include" -Icsrc/include "$src" -o "$out/$prog.sim" \
      -L"$libdir" -lsimcuda -lsimcuda_testkernels -Wl,-rpath,"$libdir"
done
# kernels.c calls the driver API too (cuFuncGetParamInfo, cuModuleGetGlobal).
bash scripts/gpu/lib/check_needed.sh "$out/kernels.gpu" libgpukernels.so libcudart.so libcuda.so.1
# Runs a program (its stdout is line-buffered: common.h) into OUT.txt, addresses filtered out;
# a non-zero exit or a signal is reported with the last line the program printed before it.
run_prog() {
  local rc=0
  "$1" >"$2.raw" 2>"$2.err" || rc=$?
  grep -vE '^(first|reused):' "$2.raw" >"$2.txt" || true
  [ "$rc" = 0 ] && return 0
  if [ "$rc" -gt 128 ]; then
    echo "FAIL: $3 killed by signal $((rc - 128)) ($(kill -l $((rc - 128)) 2>/dev/null || echo '?'))"
  else
    echo "FAIL: $3 exited with status $rc"
  fi
  echo "  the last line it printed: $(tail -n 1 "$2.raw" | grep . || echo '(none)')"
  sed 's/^/  stderr: /' "$2.err" | tail -n 5
  return 1
}
for prog in "${programs[@]}"; do
  run_prog "$out/$prog.gpu" "$out/$prog.gpu" "$prog on the GPU" || status=1
  run_prog "$out/$prog.sim" "$out/$prog.sim" "$prog on simcuda" || status=1
  if diff -u "$out/$prog.gpu.txt" "$out/$prog.sim.txt"; then
    echo "parity $prog: identical ($(wc -l < "$out/$prog.gpu.txt") lines)"
  else
    echo "parity $prog: DIFFERS (GPU first, simcuda second)"; status=1
  fi
done
exit $status
