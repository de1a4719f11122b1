"""vLLM cold start three ways, side by side in one run: vLLM's default start-up, vLLM with its
persisted startup plan (VLLM_ENABLE_STARTUP_PLAN=1: KV size remembered, graphs still captured),
and Medusa's restore (KV size and every CUDA graph from the artifact). Needs an NVIDIA GPU, vLLM
(pip install 'medusa-coldstart[vllm]') and the model on local disk.

    python scripts/bench/vllm_coldstart.py --model /models/Qwen2.5-0.5B-Instruct [-- vLLM args]

Prints, for each way: vLLM's own "init engine ... took" seconds, the graph stage seconds
(capture, or Medusa's restore), TPOT at batch 1 and 16, and whether greedy outputs are
token-identical to the default's. Ratios are default / way.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from medusa.integrations.vllm.materialize import startup_command, strip_kv_size
from medusa.progress import Progress
from medusa.trace import recorder_env

INIT = re.compile(r"init engine \(profile, create kv cache, warmup model\) took ([0-9.]+)")
RESTORED = re.compile(r"medusa: restored (\d+) vLLM graphs \((\d+) nodes\) in ([0-9.]+) s")
FALLBACK = re.compile(r"medusa: restore failed, (.*)")


def clean_env() -> dict[str, str]:
    drop = ("MEDUSA_", "VLLM_ENABLE_STARTUP_PLAN")
    return {k: v for k, v in os.environ.items() if not k.startswith(drop)}


def start(name: str, argv: list[str], env: dict[str, str], work: Path) -> dict:
    out = work / f"{name}.json"
    t0 = time.perf_counter()
    res = subprocess.run(
        startup_command(out, argv, bench=True), env=env, capture_output=True, text=True
    )
    wall = time.perf_counter() - t0
    log = res.stdout + res.stderr
    (work / f"{name}.log").write_text(log)
    if res.returncode != 0:
        sys.exit(f"{name}: vLLM exited {res.returncode}; see {work / f'{name}.log'}\n{log[-3000:]}")
    r = json.loads(out.read_text())
    m = INIT.search(log)
    r["init_engine_s"] = float(m.group(1)) if m else float("nan")
    r["graph_stage_s"] = r["phase_seconds"].get("graph_capture", float("nan"))
    r["process_s"] = wall
    fb = FALLBACK.search(log)
    r["fallback"] = fb.group(1) if fb else None
    rs = RESTORED.search(log)
    r["restored"] = rs.groups() if rs else None
    return r


def main() -> int:
    argv = sys.argv[1:]
    split = argv.index("--") if "--" in argv else len(argv)
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="a local model directory (no hub downloads)")
    ap.add_argument("--work", default=None, help="where logs and the artifact go")
    opts = ap.parse_args(argv[:split])
    vargs = [opts.model, *argv[split + 1 :]]
    work = Path(opts.work or tempfile.mkdtemp(prefix="medusa-vllm-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    art = work / "artifact"
    t0 = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "medusa.cli", "materialize", "--engine", "vllm", "--out", str(art),
         *vargs],
        env=clean_env(), check=True,
    )  # fmt: skip
    materialize_s = time.perf_counter() - t0
    manifest = json.loads((art / "manifest.json").read_text())
    # Every way starts with the recorded arguments (vllm serve's defaults pinned, as a restore
    # runs), so the three are configured alike; the KV size stays each way's own.
    vargs = strip_kv_size(manifest["engine"]["argv"])

    progress = Progress(steps=4)
    with progress.step("vLLM's default start-up"):
        results = {"default": start("default", vargs, clean_env(), work)}
    plan_env = {**clean_env(), "VLLM_ENABLE_STARTUP_PLAN": "1"}
    with progress.step("the first start-up plan run (profiles and saves it)"):
        start("plan-save", vargs, plan_env, work)
    with progress.step("a start-up from the saved plan"):
        results["startup plan"] = start("plan", vargs, plan_env, work)
    env = recorder_env(work / "restore-%p.mtr", mode="restore", base=clean_env())
    env["MEDUSA_ARTIFACT"] = str(art)
    with progress.step("a start-up restored by Medusa"):
        results["medusa"] = start("medusa", vargs, env, work)

    base = results["default"]
    print(f"\nmodel {opts.model}; artifact {len(manifest['vllm']['graphs'])} graphs, "
          f"{manifest['graphs']['nodes']} nodes; materialize {materialize_s:.1f} s")  # fmt: skip
    print(f"{'start-up':14} {'init engine s':>14} {'graph stage s':>14} {'TPOT b1 ms':>11} "
          f"{'TPOT b16 ms':>12} {'identical':>10}")  # fmt: skip
    for name, r in results.items():
        same = all(r[f"tokens_batch{b}"] == base[f"tokens_batch{b}"] for b in (1, 16))
        tpot = f"{r['tpot_batch1'] * 1e3:11.3f} {r['tpot_batch16'] * 1e3:12.3f}"
        print(f"{name:14} {r['init_engine_s']:14.2f} {r['graph_stage_s']:14.3f} {tpot} "
              f"{str(same):>10}")  # fmt: skip
    med = results["medusa"]
    if med["fallback"]:
        print(f"medusa restore FELL BACK: {med['fallback']}")
    for name in ("default", "startup plan"):
        r = results[name]
        print(f"init engine: medusa {r['init_engine_s'] / med['init_engine_s']:.1f}x faster than "
              f"{name}; graph stage {r['graph_stage_s'] / med['graph_stage_s']:.1f}x")  # fmt: skip
    for b in (1, 16):
        d = med[f"tpot_batch{b}"] / base[f"tpot_batch{b}"] - 1
        print(f"TPOT batch {b}: medusa {d * 100:+.2f}% vs captured graphs")
    (work / "summary.json").write_text(json.dumps(results, indent=1, default=str))
    print(f"logs and summary: {work}")
    return 0 if not med["fallback"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
