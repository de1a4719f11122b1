#!/usr/bin/env bash
# Runs the reference engine on a real GPU (csrc/kernels/cuda/, built with MEDUSA_BUILD_CUDA=ON)
# and on simcuda, and compares greedy answers and decode speed. On a machine with a GPU, after
# scripts/gpu/all.sh installed Medusa:
#   bash scripts/gpu/engine_parity.sh
# MEDUSA_GPU_MODEL: smollm2 (default; its answer must name Paris) or a .gguf file (all.sh's tiny
# random Llama: answers compared, not judged).
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/gpu/lib/require.sh
require_medusa cuda
model=$(require_model)
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
cat > "$out/engine_parity.py" <<'PY'
import json, sys, time
from medusa.engine.config import EngineConfig
from medusa.engine.llm_engine import LLMEngine
from medusa.engine.sampling import SamplingParams
e = LLMEngine(EngineConfig(model=sys.argv[1], max_num_seqs=8, max_num_batched_tokens=256,
                           max_model_len=512))
prompts = ["What is the capital of France?", "Name three colours.", "What is 2 + 2?"]
t0 = time.perf_counter()
out = e.generate(prompts, SamplingParams(max_tokens=24), chat=True)
dt = time.perf_counter() - t0
print(json.dumps({"device": e.device.kind, "answers": out, "startup": e.timings, "seconds": dt}))
PY
gpu=$(MEDUSA_DEVICE=cuda python "$out/engine_parity.py" "$model" | tail -1)
sim=$(MEDUSA_DEVICE=sim python "$out/engine_parity.py" "$model" | tail -1)
echo "model: $model"
echo "gpu: $gpu"
echo "sim: $sim"
python - "$gpu" "$sim" "$model" <<'PY'
import json, sys
g, s = json.loads(sys.argv[1]), json.loads(sys.argv[2])
assert g["device"] == "cuda", g["device"]
same = sum(a == b for a, b in zip(g["answers"], s["answers"]))
print(f"identical greedy answers: {same}/{len(s['answers'])} (float summation order differs)")
print(f"generate seconds: gpu {g['seconds']:.2f}, sim {s['seconds']:.2f}")
if "smollm2" in sys.argv[3].lower():
    assert "Paris" in g["answers"][0], "the GPU kernels did not answer the reference question"
PY
