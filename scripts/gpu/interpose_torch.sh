#!/usr/bin/env bash
# Records a PyTorch CUDA-graph capture on a real GPU with the LD_PRELOAD recorder and checks the
# trace: allocations from the caching allocator, launches that reached the driver through
# cuGetProcAddress (cuBLAS, Triton-free), the captured graph's kernel nodes with the launches that
# made them, no entry point the driver handed out left unhooked, and output unchanged by
# recording (seeded inputs, so that the two runs compute the same). Run on a machine with a GPU
# and a CUDA torch:
#   bash scripts/gpu/interpose_torch.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/gpu/lib/require.sh  # Medusa installed by scripts/gpu/all.sh; a check never installs
require_medusa
out=$(mktemp -d)
# NOTE: torch seeds its default CUDA generator from /dev/urandom in every process: unseeded, the
# plain and the recorded run draw different inputs. The three checksums tell an input difference
# (x, w) from a computation the recorder changed (y alone).
cat > "$out/graph.py" <<'PY'
import torch
torch.manual_seed(0)  # seeds the CUDA generators too
x = torch.randn(256, 256, device="cuda")
w = torch.randn(256, 256, device="cuda")
s = torch.cuda.Stream()
with torch.cuda.stream(s):
    for _ in range(3):
        y = torch.relu(x @ w)  # warm-up: cuBLAS handles and workspaces
torch.cuda.synchronize()
g = torch.cuda.CUDAGraph()
with torch.cuda.graph(g):
    y = torch.relu(x @ w)
g.replay()
torch.cuda.synchronize()
print(f"checksums: x {float(x.double().sum())!r} w {float(w.double().sum())!r} y {float(y.double().sum())!r}")
PY
plain=$(python "$out/graph.py")
rc=0
python -m medusa.cli trace record -o "$out/torch2.mtr" -- python "$out/graph.py" \
  > "$out/rec.txt" 2> "$out/rec.err" || rc=$?
cat "$out/rec.err"
[ "$rc" = 0 ] || { echo "FAIL: the recorded run exited $rc"; exit 1; }
rec=$(tail -1 "$out/rec.txt")
echo "plain:    $plain"
echo "recorded: $rec"
if [ "$plain" != "$rec" ]; then
  # ${x% y *} drops the y checksum: equal inputs with a different y is the recorder's doing
  if [ "${plain% y *}" = "${rec% y *}" ]; then
    echo "FAIL: recording changed the result (same inputs x, w; different output y)"
  else
    echo "FAIL: the two runs drew different inputs (x or w differ): the check's seeding is broken"
  fi
  exit 1
fi
if grep -q "not recorded" "$out/rec.err"; then
  echo "FAIL: the recorder left an entry point unhooked (its lines above): calls went unrecorded"
  exit 1
fi
python -m medusa.cli trace summarize "$out/torch2.mtr"
python - "$out/torch2.mtr" <<'PY'
import sys
from medusa.trace import Ev, read_trace
from medusa.trace import records as R
t = read_trace(sys.argv[1])
ends = [e for e in t.of(R.CaptureEnd, Ev.CAPTURE_END) if e.result == 0 and e.num_nodes]
assert ends, "no successful capture recorded"
nodes = [n for n in t.of(R.Node, Ev.NODE) if n.graph == ends[-1].graph and n.type == 0]
launch_nodes = {x.node for x in t.of(R.Launch, Ev.LAUNCH) if x.node}
assert nodes and all(n.node in launch_nodes for n in nodes), "a kernel node without its launch"
funcs = {f.func: f for f in t.of(R.Func, Ev.FUNC)}
names = [funcs[n.func].name for n in nodes if n.func in funcs]
apis = sorted({x.api for x in t.of(R.Launch, Ev.LAUNCH)})
print("graph kernels:", names)
print("launch apis:", apis)
assert any(a.startswith("cuLaunchKernel") for a in apis), "no driver-level (cuBLAS) launch seen"
assert t.of(R.Load, Ev.LOAD), "no module/library load seen"
print("interpose_torch: ok")
PY
