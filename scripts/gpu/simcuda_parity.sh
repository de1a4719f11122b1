#!/usr/bin/env bash
# Runs simcuda's C test programs against the real CUDA runtime and a real GPU, and diffs what they
# print (error names, results) with what they print on simcuda. Run on a machine with a GPU:
#   bash scripts/gpu/simcuda_parity.sh
# Addresses differ by design and are filtered out; everything else must match.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=$(mktemp -d)
nvcc -arch=native -shared -Xcompiler -fPIC csrc/kernels/cuda/testkernels.cu -o "$out/libgpukernels.so"
libdir=$(python -c 'from medusa.cuda import paths; print(paths.lib_dir())')
status=0
for prog in basics capture_rules bad_input kernels event_waits; do
  src=tests/cuda/programs/$prog.c
  gcc -O2 -I/usr/local/cuda/include -Icsrc/include "$src" -o "$out/$prog.gpu" \
      -L/usr/local/cuda/lib64 -L"$out" -lcudart -lgpukernels -Wl,-rpath,/usr/local/cuda/lib64:"$out"
  gcc -O2 -I/usr/local/cuda/include -Icsrc/include "$src" -o "$out/$prog.sim" \
      -L"$libdir" -lsimcuda -lsimcuda_testkernels -Wl,-rpath,"$libdir"
  "$out/$prog.gpu" | grep -vE '^(first|reused):' > "$out/$prog.gpu.txt" || true
  "$out/$prog.sim" | grep -vE '^(first|reused):' > "$out/$prog.sim.txt" || true
  if diff -u "$out/$prog.gpu.txt" "$out/$prog.sim.txt"; then
    echo "parity $prog: identical ($(wc -l < "$out/$prog.gpu.txt") lines)"
  else
    echo "parity $prog: DIFFERS (GPU first, simcuda second)"; status=1
  fi
done
exit $status
