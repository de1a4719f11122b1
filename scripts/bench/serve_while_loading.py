"""Serve while loading (issue 17): time to first token of a restored start with the weight store,
each layer waiting for its own weights (--serve-while-loading; the default on a GPU) vs waiting
for the whole load first (--no-serve-while-loading), side by side in one run, and the full
load's own time. Seconds from process start; `ready` is when the engine returned, `load_end` when
the store's last chunk was in (the copy runs from the weights_load stage on).
Run: python scripts/bench/serve_while_loading.py [--repeat 3] [--model FILE.gguf|DIR]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from serverless import clean_env  # scripts/bench/, next to this file

from medusa.progress import Progress
from medusa.trace import recorder_env

CHILD = """
import json, sys, time
t0 = time.time()
from medusa.engine.config import EngineConfig
from medusa.engine.llm_engine import LLMEngine
from medusa.engine.sampling import SamplingParams
cfg = EngineConfig(**json.loads(sys.argv[1]))
imported = time.time()
e = LLMEngine(cfg, artifact=sys.argv[2], require_artifact=True)
ready = time.time()
e.add_request(e.tokenizer.encode("Hello, how are you today?"), SamplingParams(max_tokens=1))
e.step()
first = time.time()
t = e.timings
load_start = imported + t["runtime_init"] + t["weights_alloc"]
copy = t.get("weights_copy", t.get("first_request_weights_copy"))  # gated: settled serving
print(json.dumps({"imported": imported, "ready": ready, "first": first, "restored": e.restored,
                  "load_start": load_start, "copy": copy, "timings": t,
                  "store_error": e.store_error}))
"""


def child(cfg: dict, art: str, env: dict[str, str]) -> dict[str, float]:
    t0 = time.time()
    res = subprocess.run([sys.executable, "-c", CHILD, json.dumps(cfg), art], env=env,
                         capture_output=True, text=True)  # fmt: skip
    if res.returncode:
        sys.exit(f"a start failed:\n{res.stderr[-3000:]}")
    o = json.loads(res.stdout.strip().splitlines()[-1])
    if not o["restored"] or o["store_error"]:
        sys.exit(f"not a restored start with the store: {o}")
    return {
        "ready": o["ready"] - t0,
        "ttft": o["first"] - t0,
        "first_step": o["first"] - o["ready"],
        "load_end": o["load_start"] + o["copy"] - t0,
        "copy": o["copy"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3, help="starts of each kind; medians shown")
    ap.add_argument("--json", action="store_true", help="also print every start's figures")
    ap.add_argument(
        "--model", default=None, help="'smollm2' (default), a .gguf file or a directory"
    )
    args = ap.parse_args()
    cfg = {"max_num_seqs": 8, "max_num_batched_tokens": 512, "max_model_len": 1024}
    env = clean_env()
    with tempfile.TemporaryDirectory() as tmp:
        art = Path(tmp) / "art"
        opts = [f"--{k.replace('_', '-')}={v}" for k, v in cfg.items()]
        opts += [args.model] if args.model else []
        cfg["model"] = args.model
        progress = Progress(steps=1 + 2 * args.repeat)
        with progress.step("materializing"):
            subprocess.run([sys.executable, "-m", "medusa.cli", "materialize", *opts, "--out",
                            str(art)], env=env, check=True, capture_output=True)  # fmt: skip
        renv = recorder_env(Path(tmp) / "r-%p.mtr", mode="restore", base=env)
        runs: dict[bool, list[dict[str, float]]] = {True: [], False: []}
        for i in range(args.repeat):  # alternating, so that both kinds meet the same noise
            for on in (True, False):
                way = "gated by layer" if on else "waiting for all weights"
                with progress.step(f"start {i + 1} of {args.repeat}, {way}"):
                    runs[on].append(child({**cfg, "serve_while_loading": on}, str(art), renv))
    med = {on: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for on, rs in runs.items()}
    print(f"{'seconds (median of ' + str(args.repeat) + ')':28} {'gated':>8} {'wait all':>9}")
    for k, what in (
        ("ready", "engine ready"),
        ("load_end", "full load done"),
        ("copy", "load's own time"),
        ("first_step", "ready -> first token"),
        ("ttft", "time to first token"),
    ):
        print(f"  {what:26} {med[True][k]:8.3f} {med[False][k]:9.3f}")
    gain = med[False]["ttft"] - med[True]["ttft"]
    print(f"first token {abs(gain):.3f} s {'sooner' if gain >= 0 else 'later'} gated "
          f"(waiting / gated: {med[False]['ttft'] / med[True]['ttft']:.2f}x)")  # fmt: skip
    if args.json:
        print(json.dumps({"gated": runs[True], "wait_all": runs[False]}))


if __name__ == "__main__":
    main()
