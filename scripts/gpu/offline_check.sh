#!/usr/bin/env bash
# Proves that scripts/gpu/all.sh needs no network, as on the lent GPU machine (issue 28):
#   bash scripts/gpu/offline_check.sh [WORKDIR]     (default: a temporary directory, removed after)
# 1. Prepare, network allowed: the kit (scripts/gpu/kit.sh), and a stand-in of the lent machine's
#    Python (a Python 3.12 venv holding the packages of scripts/gpu/device-image.txt that the
#    checks and the kit's wheels import; not torch, triton, transformers, cupy, ...).
# 2. In a network namespace with no network at all (`unshare -n`, started here: root or
#    unprivileged user namespaces needed), all.sh's two device calls, --phase 1 then --phase 2:
#    the first installs from the kit, the second joins SmolLM2 and reuses the install, and every
#    check ends "skipped: no GPU" (this machine has none). Asserted from each summary.json: no
#    step FAILED, no check ran or skipped for another reason, no pip network error in any log.
set -euo pipefail
cd "$(dirname "$0")/../.."
repo=$(pwd)
say() { echo "offline_check: $*"; }
die() { echo "offline_check: $*" >&2; exit 1; }

# Which unshare works here: as root `unshare -n`; otherwise a user namespace mapped to root.
netns=()
if unshare -n true 2>/dev/null; then netns=(unshare -n)
elif unshare -rn true 2>/dev/null; then netns=(unshare -rn)
else die "cannot make a network namespace (unshare -n and unshare -rn are not permitted here:" \
  "run as root or allow unprivileged user namespaces); offline-ness cannot be proven"
fi

py312=
for py in "${MEDUSA_PY312:-}" python3.12 /usr/bin/python3.12 /usr/local/bin/python3.12 \
  "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.12*/bin/python3.12; do
  [ -n "$py" ] && "$py" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))' 2>/dev/null \
    && { py312=$(command -v "$py"); break; }
done
[ -n "$py312" ] || die "no Python 3.12 found (the lent machine's is 3.12.3); set MEDUSA_PY312"

if [ -n "${1:-}" ]; then work=$1; mkdir -p "$work"
else work=$(mktemp -d -t medusa-offline-XXXXXX); trap 'rm -rf "$work"' EXIT; fi
t0=$SECONDS

# ---- 1. prepare (network) ----
bash scripts/gpu/kit.sh "$work/kit"
t1=$SECONDS
# The image's packages that the checks import: the runtime dependencies it has (pyproject.toml),
# the build backend, the test runner, and those the kit's wheels require (its fallbacks' names);
# their own dependencies come with them, at the image's versions where the list knows them.
mapfile -t pkgs < <("$py312" - "$work/kit/common/kit.json" <<'PY'
import json, re, sys, tomllib
def canon(name): return re.sub(r"[-_.]+", "-", name).lower()
image = {}
for line in open("scripts/gpu/device-image.txt"):
    line = line.split("#", 1)[0].strip()
    if line:
        name, _, version = line.partition("==")
        image[canon(name)] = version
deps = tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]
names = {canon(re.match(r"[A-Za-z0-9._-]+", d)[0]) for d in deps}
names |= {canon(w.split("-")[0]) for w in json.load(open(sys.argv[1]))["fallback"]}
for n in sorted((names & image.keys()) | {"scikit-build-core", "pytest", "hypothesis"}):
    print(f"{n}=={image[n]}" if image[n] else n)
PY
)
say "stand-in of the image's python: $py312 + ${pkgs[*]}"
rm -rf "$work/image"
"$py312" -m venv "$work/image"
grep -E '^[A-Za-z0-9._-]+==' scripts/gpu/device-image.txt >"$work/image-versions.txt"
"$work/image/bin/python" -m pip install -q --disable-pip-version-check \
  -c "$work/image-versions.txt" "${pkgs[@]}" \
  || die "could not install the stand-in's packages (this step needs a network)"
extra=$("$work/image/bin/python" - <<'PY'
import re
from importlib.metadata import distributions
image = {re.sub(r"[-_.]+", "-", l.split("#")[0].split("==")[0].strip()).lower()
         for l in open("scripts/gpu/device-image.txt")} - {""}
have = {re.sub(r"[-_.]+", "-", d.metadata["Name"]).lower() for d in distributions()}
print(" ".join(sorted(have - image - {"pip", "setuptools", "wheel"})))
PY
)
[ -z "$extra" ] || say "note: the stand-in also holds $extra, which device-image.txt does not list"
say "prepared in $((SECONDS - t0)) s (kit $((t1 - t0)) s, stand-in $((SECONDS - t1)) s)"

# ---- 2. the two device calls, with no network ----
for phase in 1 2; do
  t1=$SECONDS
  say "all.sh --phase $phase in a network namespace with no network (${netns[*]})"
  rm -rf "$work/out$phase" "$work/call$phase"
  mkdir "$work/call$phase"  # what the call carries: the kit's common part and its own part
  ln -s "$work/kit/common" "$work/kit/part$phase" "$work/call$phase/"
  "${netns[@]}" env MEDUSA_GPU_PYTHON="$work/image/bin/python3" \
    bash "$repo/scripts/gpu/all.sh" --phase "$phase" --kit "$work/call$phase" \
    --state "$work/state" --out "$work/out$phase" || true  # judged from its summary below
  archive=$work/out$phase/medusa-gpu-phase$phase.tar.gz
  [ -f "$archive" ] || die "phase $phase wrote no archive under $work/out$phase"
  mkdir -p "$work/logs$phase" && tar -xzf "$archive" -C "$work/logs$phase"
  if grep -lE 'NewConnectionError|Network is unreachable|Temporary failure in name resolution|No matching distribution|Could not find a version' \
    "$work/logs$phase"/*.log; then
    die "phase $phase: a pip network error in the log(s) above"
  fi
  "$py312" - "$work/logs$phase/summary.json" "$phase" <<'PY' || die "phase $phase: see above"
import json, sys
rows = json.load(open(sys.argv[1]))["checks"]
want = {"1": ["stash", "install", "imports", "tiny_model"], "2": ["join", "install", "imports"]}
bad = [r for r in rows if r["kind"] == "setup" and r["status"] != "ok"]
bad += [r for r in rows if r["kind"] == "check" and (r["status"], r["reason"]) != ("skipped", "no GPU")]
setup = [r["check"] for r in rows if r["kind"] == "setup"]
for r in bad:
    print(f"  {r['check']}: {r['status']} {r['reason']}", file=sys.stderr)
if setup != want[sys.argv[2]]:
    print(f"  set-up steps {setup}, expected {want[sys.argv[2]]}", file=sys.stderr)
checks = [r["check"] for r in rows if r["kind"] == "check"]
done = ", ".join(r["check"] + " " + r["status"] for r in rows if r["kind"] == "setup")
print(f"  phase {sys.argv[2]}: {done}; {len(checks)} checks skipped: no GPU")
install = next((r for r in rows if r["check"] == "install"), {})
if sys.argv[2] == "2" and not install.get("figure", "").startswith("reused"):
    print(f"  call 2 did not reuse call 1's install: {install}", file=sys.stderr)
    bad.append(install)
sys.exit(bool(bad) or setup != want[sys.argv[2]])
PY
  say "phase $phase took $((SECONDS - t1)) s"
done
say "ok: both calls ran offline from the kit (total $((SECONDS - t0)) s)"
