#!/usr/bin/env bash
# The real NCCL under Medusa's NCCL calls, on one GPU (NCCL refuses two ranks on one GPU, so the
# multi-rank checks need a multi-GPU machine): a communicator of one rank; an all-reduce and an
# all-gather, eager and inside a captured CUDA graph, checked; then the engine as a
# tensor-parallel group of one (its decode and prefill graphs hold NCCL's kernels) against the
# engine alone: the same greedy tokens. On a machine with a GPU, after scripts/gpu/all.sh
# installed Medusa:
#   bash scripts/gpu/nccl_one_rank.sh
# MEDUSA_GPU_MODEL: smollm2 (default; all.sh's call 2) or a .gguf file.
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/gpu/lib/require.sh
require_medusa cuda
model=$(require_model)
export MEDUSA_DEVICE=cuda
python - <<'PY' || exit $?
import struct, sys
from medusa.cuda import load_backend
from medusa.cuda.nccl import Nccl, NcclError
b = load_backend("cuda")
try:
    nccl = Nccl(b)
except NcclError as e:
    print(f"SKIP: no NCCL library here: {e}")
    sys.exit(77)
comm = nccl.init_rank(1, nccl.unique_id(), 0)
n, s = 1000, b.stream_create()
x = b.malloc(4 * n)
b.memcpy_htod(x, struct.pack(f"{n}f", *[float(i) for i in range(n)]))
y, g = b.malloc(4 * n), b.malloc(4 * n)
comm.all_reduce(x, y, n, stream=s)
comm.all_gather(x, g, n, stream=s)
b.stream_synchronize(s)
assert b.memcpy_dtoh(y, 4 * n) == b.memcpy_dtoh(x, 4 * n) == b.memcpy_dtoh(g, 4 * n)
b.begin_capture(s)
comm.all_reduce(x, y, n, op="max", stream=s)
graph = b.graph_instantiate(b.end_capture(s))
b.memset(y, 0, 4 * n)
b.graph_launch(graph, s)
b.stream_synchronize(s)
assert b.memcpy_dtoh(y, 4 * n) == b.memcpy_dtoh(x, 4 * n), "the captured all-reduce"
print(f"NCCL {nccl.version()}: all-reduce and all-gather over one rank, eager and captured: ok")
comm.destroy()
PY
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
uid=$(python -c 'from medusa.cuda import load_backend; from medusa.cuda.nccl import Nccl
print(Nccl(load_backend("cuda")).unique_id().hex())')
mkdir "$out/plain" "$out/tp"
python tests/engine/programs/tp_rank.py "$uid" 1 0 "$model" "$out/plain" short
python tests/engine/programs/tp_rank.py "$uid" 1 0 "$model" "$out/tp" short tp
python - "$out" <<'PY'
import json, sys
import numpy as np
plain, tp = (json.load(open(f"{sys.argv[1]}/{d}/rank0.json")) for d in ("plain", "tp"))
lp, lt = (np.load(f"{sys.argv[1]}/{d}/rank0.npy") for d in ("plain", "tp"))
print(f"engine alone vs a tensor-parallel group of one: tokens "
      f"{'identical' if plain['tokens'] == tp['tokens'] else 'DIFFER'}, logits differ by up to "
      f"{float(np.abs(lp - lt).max()):.2e}; start-up {plain['timings']['total']:.2f} s vs "
      f"{tp['timings']['total']:.2f} s")
assert plain["tokens"] == tp["tokens"]
PY
