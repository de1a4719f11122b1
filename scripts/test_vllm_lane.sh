#!/usr/bin/env bash
# The optional vLLM test lane: the plugin tests against the real vLLM, on the CPU.
#
#   bash scripts/test_vllm_lane.sh [0.32|0.33|all]     (default: all)
#
# One venv per vLLM series, /tmp/medusa-vllm-lane-<series> (VLLM_LANE_ROOT=/tmp/medusa-vllm-lane
# changes the prefix), made once and reused. Each sees the packages of the python that runs this
# script (medusa installed with its entry point, torch's CPU build). vLLM's media extras built for
# CUDA torch are removed so that vLLM imports on torch's CPU build.
#
# NOTE: vLLM 0.33 pins torch==2.14.0, whose PyPI wheel is the CUDA build (several GB). Its lane
# installs 0.32's dependencies (torch 2.13's CPU build) and then vLLM 0.33 without dependencies:
# enough for imports, argument parsing and the patch points, which is all the lane checks.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python}
root=${VLLM_LANE_ROOT:-/tmp/medusa-vllm-lane}
series=${1:-all}
[ "$series" = all ] && series="0.32 0.33"

pip_in() {  # pip of a venv, without the notes about this machine's local index mirrors
    local venv=$1
    shift
    "$venv/bin/pip" "$@" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
}

has_vllm() {  # has_vllm VENV SERIES: the venv holds a vLLM of that series
    "$1/bin/python" -c 'import importlib.metadata as m, sys
sys.exit(not m.version("vllm").startswith(sys.argv[1]))' "$2" 2>/dev/null
}

lane() {
    local v=$1 venv="$root-$1" t0 t1 t2
    t0=$(date +%s)
    if [ ! -x "$venv/bin/python" ]; then
        "$python" -m venv --system-site-packages "$venv"
        # the packages of the python running this (medusa and its entry point, torch CPU)
        "$python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' \
            >"$(ls -d "$venv"/lib/python3.*/site-packages)/medusa-lane.pth"
    fi
    case $v in
    0.32) pip_in "$venv" install -q "vllm==0.32.*" torch==2.13.0 ;;
    0.33)
        if ! has_vllm "$venv" 0.33.; then
            pip_in "$venv" install -q "vllm==0.32.*" torch==2.13.0
            pip_in "$venv" install -q --no-deps "vllm==0.33.*"
        fi
        ;;
    *) echo "unknown vLLM series $v (0.32, 0.33 or all)" >&2; return 2 ;;
    esac
    "$venv/bin/pip" uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
    t1=$(date +%s)
    local rc=0
    "$venv/bin/python" -m pytest -q -p no:cacheprovider tests/integrations || rc=$?
    t2=$(date +%s)
    echo "vLLM lane $v: $("$venv/bin/python" -c 'import vllm; print(vllm.__version__)' 2>/dev/null)," \
        "install $((t1 - t0)) s, tests $((t2 - t1)) s, exit $rc"
    return $rc
}

status=0
for v in $series; do lane "$v" || status=1; done
exit $status
