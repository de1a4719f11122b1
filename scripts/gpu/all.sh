#!/usr/bin/env bash
# Every GPU check, offline, in one or two calls on a lent GPU machine (it has no network):
#   bash scripts/gpu/all.sh --phase 1   # call 1: install from the kit, keep SmolLM2's part 1 on the
#                                       # machine, run every check that needs no SmolLM2 (the model
#                                       # checks on a tiny random Llama written on the spot)
#   bash scripts/gpu/all.sh --phase 2   # call 2, sent at once: join SmolLM2 (part 2 carried now),
#                                       # reuse call 1's install, run the SmolLM2 checks
#   bash scripts/gpu/all.sh             # both in one go (and vllm_coldstart if MODEL is set)
#   bash scripts/gpu/all.sh --list [--phase N]   # the steps and their time bounds only
# The kit (--kit, default .gpukit) is made beforehand by `bash scripts/gpu/kit.sh .gpukit` on a
# machine with PyPI; the install and part 1 stay in --state (default ~/medusa-gpu) between calls.
# Nothing reaches a network: pip runs with --no-index (PIP_NO_INDEX=1 for every check too). Each
# step is bounded with `timeout` (the bounds are printed first); a step whose prerequisite is
# missing is skipped with the reason; a failure does not stop the others. Every log plus
# summary.json (check, status, seconds, figure, reason) go into ONE archive,
# <out>/medusa-gpu-phase<N>.tar.gz (--out, default $OUT, else a fresh directory). Exit status 1
# if a step failed, else 0. The README's "GPU checks" section has the two device calls.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2

phase=all out=${OUT:-} kit=.gpukit state=${HOME:-/root}/medusa-gpu list=
while [ $# -gt 0 ]; do
  case $1 in
    --phase) phase=${2:-}; shift 2 ;;
    --out) out=${2:-}; shift 2 ;;
    --kit) kit=${2:-}; shift 2 ;;
    --state) state=${2:-}; shift 2 ;;
    --list) list=1; shift ;;  # the steps and their bounds; nothing runs
    -h | --help) sed -n '2,18p' "$0"; exit 0 ;;
    *) echo "all.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
case $phase in 1 | 2 | all) ;; *) echo "all.sh: --phase takes 1, 2 or all, not '$phase'" >&2; exit 2 ;; esac

# ---- the steps of each phase, and their time bounds (seconds) ----
declare -A BOUND=(
  [stash]=5 [join]=15 [install]=60 [imports]=10 [tiny_model]=5
  [interpose_torch]=40 [engine_parity]=25 [restore_parity]=60 [simcuda_parity]=30
  [hybridgemm_bandwidth]=25 [tessera_ptx]=15 [weaver]=75 [torch_restore]=125
  [engine_parity_smollm2]=40 [restore_parity_smollm2]=120 [weight_store_smollm2]=40
  [kv_slices_smollm2]=90 [nccl_one_rank_smollm2]=40
  [vllm_coldstart]=300
)
P1=(stash install imports tiny_model interpose_torch engine_parity restore_parity simcuda_parity
    hybridgemm_bandwidth tessera_ptx weaver torch_restore)
P2=(join install imports engine_parity_smollm2 restore_parity_smollm2 weight_store_smollm2
    kv_slices_smollm2 nccl_one_rank_smollm2)
case $phase in
  1) STEPS=("${P1[@]}") ;;
  2) STEPS=("${P2[@]}") ;;
  all) STEPS=("${P1[@]:0:1}" join "${P1[@]:1}" "${P2[@]:3}" vllm_coldstart) ;;
esac
SETUP=" stash join install imports tiny_model "
total=0
for s in "${STEPS[@]}"; do [ "$s" = vllm_coldstart ] || total=$((total + BOUND[$s])); done
bounds=$(
  echo "phase $phase: time bounds, seconds$([ "$phase" = all ] && echo " (vllm_coldstart's only with MODEL)"):"
  for s in "${STEPS[@]}"; do printf '  %-24s %4s\n' "$s" "${BOUND[$s]}"; done
  printf '  %-24s %4s (%d min %d s)\n' total "$total" $((total / 60)) $((total % 60))
  [ "$phase" = 2 ] && printf '  %-24s %4s (when call 1'"'"'s install is reused)\n' \
    "without install" $((total - BOUND[install]))
)
echo "$bounds"
[ -z "$list" ] || exit 0

out=${out:-$(mktemp -d -t medusa-gpu-out-XXXXXX)}
mkdir -p "$out" || { echo "all.sh: cannot create the output directory $out" >&2; exit 2; }
logs=$(mktemp -d -t medusa-gpu-logs-XXXXXX)
echo "$bounds" >"$logs/bounds.txt"

# ---- offline, for this script and every check it runs ----
unset PIP_FIND_LINKS PIP_INDEX_URL PIP_EXTRA_INDEX_URL PIP_CONSTRAINT PIP_REQUIREMENT
export PIP_NO_INDEX=1 PIP_CONFIG_FILE=/dev/null PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1
export PIP_RETRIES=0 PIP_TIMEOUT=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONNOUSERSITE=1

export KIT=$kit STATE=$state VENV=$state/venv
(umask 077 && mkdir -p "$STATE") || { echo "all.sh: cannot create $STATE" >&2; exit 2; }
for py in "${MEDUSA_GPU_PYTHON:-}" /opt/torch/.venv/bin/python3 python3; do
  [ -n "$py" ] && BASE_PY=$(command -v "$py") && break
done
export BASE_PY
for d in /usr/local/cuda/bin /usr/local/nvidia/bin; do [ -d "$d" ] && PATH=$PATH:$d; done
export PATH
has_nvcc() { command -v nvcc >/dev/null 2>&1; }
export CUDA_BUILD=OFF
has_nvcc && CUDA_BUILD=ON
has_gpu() { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU'; }
has_gpu && gpu=yes || gpu=

declare -A STATUS
model_smollm2() { local m; m=$(compgen -G "$KIT/common/*.sha256" | head -1) && echo "$STATE/model/$(basename "$m" .sha256)"; }
cuda_torch=
has_cuda_torch() {
  [ -n "$cuda_torch" ] || { python -c 'import torch, sys; sys.exit(not torch.cuda.is_available())' \
    >/dev/null 2>&1 && cuda_torch=yes || cuda_torch=no; }
  [ "$cuda_torch" = yes ]
}

# Why STEP cannot run here (empty: it can).
missing() {
  local s=$1
  case $s in
    stash | join) return ;;
    install)  # (a machine that came back bare lost part 1 as well: reinstalling buys nothing)
      [ "$phase" != 2 ] || [ "${STATUS[join]:-}" = ok ] \
        || echo "SmolLM2 not joined (see join): nothing in this call needs the install"
      return ;;
    imports) [ "${STATUS[install]:-}" = ok ] || echo "Medusa not installed (see install)"; return ;;
    tiny_model) [ "${STATUS[imports]:-}" = ok ] || echo "Medusa not importable (see imports)"; return ;;
  esac
  [ -n "$gpu" ] || { echo "no GPU"; return; }
  case $s in
    *_smollm2) [ "${STATUS[join]:-}" = ok ] || { echo "SmolLM2 not joined (see join)"; return; } ;;
    *) [ -f "scripts/gpu/$s.sh" ] || { echo "scripts/gpu/$s.sh is not in this tree"; return; } ;;
  esac
  [ "${STATUS[imports]:-}" = ok ] || { echo "Medusa not importable (see install, imports)"; return; }
  case $s in
    engine_parity | restore_parity)
      [ "${STATUS[tiny_model]:-}" = ok ] || { echo "no tiny model (see tiny_model)"; return; } ;;
  esac
  case $s in
    interpose_torch | hybridgemm_bandwidth | torch_restore)
      has_cuda_torch || { echo "no CUDA build of torch"; return; } ;;
  esac
  case $s in
    simcuda_parity | tessera_ptx | weaver) has_nvcc || echo "no nvcc (CUDA toolkit)" ;;
    vllm_coldstart)
      if [ -z "${MODEL:-}" ]; then echo "MODEL not set (a local model directory)"
      elif ! python -c 'import vllm' >/dev/null 2>&1; then echo "vllm not installed"
      fi ;;
  esac
}

# Runs STEP under its bound; appends "name kind status seconds reason" to steps.tsv.
run_step() {
  local s=$1 kind=check why cmd rc t0 secs status reason="" log=$logs/$1.log
  [[ $SETUP == *" $s "* ]] && kind=setup
  why=$(missing "$s")
  if [ -n "$why" ]; then
    STATUS[$s]=skipped
    printf '%s\t%s\tskipped\t\t%s\n' "$s" "$kind" "$why" >>"$logs/steps.tsv"
    return
  fi
  if [ $kind = setup ]; then cmd=(bash scripts/gpu/lib/steps.sh "$s")
  else cmd=(bash "scripts/gpu/${s%_smollm2}.sh"); fi
  local -a env=()
  case $s in
    *_smollm2) env=(MEDUSA_GPU_MODEL="$(model_smollm2)") ;;
    engine_parity) env=(MEDUSA_GPU_MODEL="$STATE/tiny/tiny-llama.gguf") ;;
    restore_parity)  # (a tiny model's load is too short for the serve-while-loading bench)
      env=(MEDUSA_GPU_MODEL="$STATE/tiny/tiny-llama.gguf" MEDUSA_GPU_REPEAT=2 MEDUSA_GPU_SERVE_BENCH=0) ;;
    torch_restore) cmd+=(--limits "30,60,30") ;;  # its stages' own bounds, inside the step's
  esac
  echo "== $s (bound ${BOUND[$s]} s; log: $s.log)"
  t0=$(date +%s.%N)
  env "${env[@]}" MEDUSA_GPU_STEP_BOUND="${BOUND[$s]}" timeout -k 5 "${BOUND[$s]}" "${cmd[@]}" \
    >"$log" 2>&1 </dev/null
  rc=$?
  secs=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
  case $rc in
    0) status=ok  # a check that finds its prerequisite missing itself says "skipped: why" last
       reason=$(grep -v '^\s*$' "$log" | tail -1 | sed -n 's/^skipped: //p')
       [ -z "$reason" ] || status=skipped ;;
    77) status=skipped reason=$(sed -n 's/^SKIP: //p' "$log" | tail -1) ;;
    124 | 137) status=FAILED reason="timed out after ${BOUND[$s]} s" ;;
    *) status=FAILED reason="exit $rc: $(grep -v '^\s*$' "$log" | tail -1 | cut -c1-300)" ;;
  esac
  STATUS[$s]=$status
  [ $status = FAILED ] && tail -5 "$log" | sed 's/^/   /'
  printf '%s\t%s\t%s\t%s\t%s\n' "$s" "$kind" "$status" "$secs" "$reason" >>"$logs/steps.tsv"
  if [ "$s" = install ] && [ $status = ok ]; then  # every later step uses what it installed,
    export PATH=$VENV/bin:$PATH VIRTUAL_ENV=$VENV    # C libraries included (not a checkout's)
    unset PYTHONPATH
    MEDUSA_LIB_DIR=$(cd / && python -c 'from importlib.metadata import distribution as d
print(d("medusa-coldstart").locate_file("medusa/_lib"))') && export MEDUSA_LIB_DIR
  fi
}

: >"$logs/steps.tsv"
for s in "${STEPS[@]}"; do
  # Without a kit (a GPU machine set up by hand) the current python is the install.
  if [ "$s" = install ] && [ ! -d "$KIT/common/wheels" ] && [ ! -f "$VENV/.medusa-stamp" ] \
    && python -c 'import medusa, fastapi' >/dev/null 2>&1; then
    STATUS[install]=ok
    echo "=> no kit at $KIT: the current python ($(command -v python)) is used as installed" \
      >"$logs/install.log"
    printf 'install\tsetup\tok\t0\t\n' >>"$logs/steps.tsv"
    continue
  fi
  run_step "$s"
done

{ uname -a; nvidia-smi 2>&1 | head -20; python -m pip list 2>&1; } >"$logs/environment.log"
for f in "$logs"/*.log; do  # the archive must come back: at most 16 MiB
  [ "$(stat -c %s "$f")" -le 4194304 ] || { tail -c 4194304 "$f" >"$f.tail" && mv "$f.tail" "$f"; }
done
"$BASE_PY" scripts/gpu/lib/summary.py "$logs" --phase "$phase" --bound-total "$total"
failed=$?
archive=$out/medusa-gpu-phase$phase.tar.gz
tar -czf "$archive" -C "$logs" . && rm -rf "$logs"
echo "archive: $archive ($(stat -c %s "$archive") bytes: every log and summary.json)"
exit $failed
