#!/usr/bin/env bash
# The set-up steps of scripts/gpu/all.sh, one per call, each bounded there with `timeout`:
#   bash scripts/gpu/lib/steps.sh stash | join | install | imports | tiny_model
# They read KIT, STATE, VENV and BASE_PY from all.sh's environment, and never reach a network
# (all.sh sets PIP_NO_INDEX=1 and friends). A step's last line "=> ..." is what it did; exit 77
# after a last line "SKIP: reason" means it had nothing to work with.
set -euo pipefail
cd "$(dirname "$0")/../../.."
: "${KIT:?} ${STATE:?} ${VENV:?} ${BASE_PY:?}"

skip() { echo "SKIP: $*"; exit 77; }
manifest() { compgen -G "$KIT/common/*.sha256" | head -1 || true; }

# Call 1: SmolLM2's first part waits on the machine, outside $OUT, for the second.
step_stash() {
  local part
  part=$(compgen -G "$KIT/part1/*.part1" | head -1) \
    || skip "no SmolLM2 part 1 in $KIT/part1 (bash scripts/gpu/kit.sh .gpukit makes it)"
  mkdir -p "$STATE/parts"
  cp "$part" "$STATE/parts/"
  echo "=> $(basename "$part") kept in $STATE/parts for call 2"
}

# Call 2: part 1 (kept by call 1) + part 2 (carried now), each and the whole checked by sha256.
step_join() {
  local m name out part1 part2
  m=$(manifest)
  [ -n "$m" ] || skip "no SmolLM2 manifest in $KIT/common (carry $KIT/common)"
  name=$(basename "$m" .sha256)
  out=$STATE/model/$name
  if [ -f "$out" ] && [ "$(sha256sum <"$out" | cut -d' ' -f1)" = "$(head -1 "$m" | cut -d' ' -f1)" ]
  then
    echo "=> $out joined before, sha256 checked"
    return
  fi
  part1=$STATE/parts/$name.part1
  [ -f "$part1" ] || part1=$KIT/part1/$name.part1
  [ -f "$part1" ] || skip "SmolLM2 part 1 is not on this machine (it came back bare, or call 1" \
    "did not run): send call 1, then call 2 at once"
  part2=$KIT/part2/$name.part2
  [ -f "$part2" ] || skip "no SmolLM2 part 2 in $KIT/part2 (call 2 carries it)"
  mkdir -p "$STATE/model"
  "$BASE_PY" scripts/gpu/lib/kit_parts.py join "$m" "$out" "$part1" "$part2"
  echo "=> $name joined, sha256 checked ($(stat -c %s "$out") bytes)"
}

# What the install was made from: a later call reuses it only if all of this is unchanged.
install_stamp() {
  {
    echo "$BASE_PY ${CUDA_BUILD:-OFF}"
    find "$KIT/common/wheels" -name '*.whl' -printf '%s %f\n' 2>/dev/null | sort
    find pyproject.toml CMakeLists.txt cmake csrc interpose medusa -type f \
      ! -path '*/__pycache__/*' ! -path 'medusa/_lib/*' -print0 | sort -z | xargs -0 sha256sum
  } | sha256sum | cut -d' ' -f1
}

# The image's python may itself be a venv (/opt/torch/.venv): a venv made from it sees only the
# base interpreter's site-packages, so its own are added by a .pth (after the venv's, so that the
# kit's wheels come first).
bridge_image() {
  local site
  site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  "$BASE_PY" - "$site/_medusa_image.pth" <<'PY'
import site, sys
if sys.prefix != sys.base_prefix:
    dirs = [d for d in site.getsitepackages() if d.startswith(sys.prefix)]
    lines = [f"import site; site.addsitedir({d!r})" for d in dirs]
    open(sys.argv[1], "w").write("\n".join(lines) + "\n")
PY
}

# Image packages the kit also brings in case the image's copy is older than the kit needs:
# installed only when `pip check` says so.
install_fallbacks() {
  local report w name
  report=$("$VENV/bin/python" -m pip check 2>&1 || true)
  for w in "$KIT"/common/fallback/*.whl; do
    [ -f "$w" ] || continue
    name=$(basename "$w" | cut -d- -f1 | tr '_.' '--' | tr '[:upper:]' '[:lower:]')
    if tr '_.' '--' <<<"$report" | tr '[:upper:]' '[:lower:]' \
      | grep -qE "(requirement|requires) ${name}[^a-z0-9-]"; then
      echo "pip check: the image's $name is too old or absent; installing $(basename "$w")"
      "$VENV/bin/python" -m pip install -q --no-index --no-deps "$w"
    fi
  done
}

step_install() {
  local stamp wheels
  stamp=$(install_stamp)
  if [ -f "$VENV/.medusa-stamp" ] && [ "$(cat "$VENV/.medusa-stamp")" = "$stamp" ]; then
    echo "=> reused the install of an earlier call ($VENV)"
    return
  fi
  [ -d "$KIT/common/wheels" ] \
    || skip "no kit at $KIT (bash scripts/gpu/kit.sh .gpukit, on a machine with PyPI)"
  rm -rf "$VENV"
  "$BASE_PY" -m venv --system-site-packages "$VENV" \
    || "$BASE_PY" -m venv --system-site-packages --without-pip "$VENV"
  bridge_image
  wheels=("$KIT"/common/wheels/*.whl)
  "$VENV/bin/python" -m pip install --no-index --no-deps "${wheels[@]}"
  install_fallbacks
  CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) CUDAARCHS=90 "$VENV/bin/python" -m pip install \
    --no-index --no-build-isolation --no-deps -C "cmake.define.MEDUSA_BUILD_CUDA=${CUDA_BUILD:-OFF}" .
  echo "$stamp" >"$VENV/.medusa-stamp"
  echo "=> installed ${#wheels[@]} wheels and Medusa (CUDA kernels: ${CUDA_BUILD:-OFF}," \
    "CUDAARCHS=90) into $VENV"
}

step_imports() {
  python - <<'PY'
import sys
import fastapi, gguf, pydantic, starlette, uvicorn, zstandard  # noqa: F401 (what the kit brings)
import medusa.cli, medusa.engine.llm_engine, medusa.serve.api_server, medusa.tessera.ptx  # noqa: F401
import tests.engine.tiny_models  # noqa: F401 (the tiny Llama of call 1)
from medusa.cuda import paths
for lib in ("simcuda", "medusa_interpose", "medusa_restore", "medusa_kernels", "medusa_blas"):
    paths.library(lib)
cuda = (paths.lib_dir() / "libmedusa_kernels_cuda.so").is_file()
print(f"=> {sys.executable}: medusa, fastapi {fastapi.__version__}, uvicorn "
      f"{uvicorn.__version__}, pydantic {pydantic.__version__}, gguf import; C libraries in "
      f"{paths.lib_dir()}, CUDA kernels {'built' if cuda else 'absent'}")
PY
  medusa --version >/dev/null
}

step_tiny_model() {
  mkdir -p "$STATE/tiny"
  python - "$STATE/tiny/tiny-llama.gguf" <<'PY'
import sys
from pathlib import Path
from gguf import GGMLQuantizationType as T
from tests.engine.tiny_models import write_gguf
write_gguf(Path(sys.argv[1]), [T.Q8_0], dims={"layers": 8})
print(f"=> {sys.argv[1]}: a random Llama, 8 layers, hidden 256, Q8_0")
PY
}

case ${1:-} in
  stash | join | install | imports | tiny_model) "step_$1" ;;
  *) echo "usage: bash scripts/gpu/lib/steps.sh stash|join|install|imports|tiny_model" >&2; exit 2 ;;
esac
