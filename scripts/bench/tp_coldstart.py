"""Tensor-parallel cold start of SmolLM2 on simcuda, measured side by side in one run at each group
size: the normal start (every rank profiles its KV cache and captures its graphs) vs the
restored one (every rank restores its own plan from one artifact), time to first token after
the ranks' processes start, and the graph stage (capture or restore) and KV sizing on each rank.
One process per rank, as `medusa run --tensor-parallel-size N` runs them; the artifact is made
first by `medusa materialize --tensor-parallel-size N` (not timed).

Run: python scripts/bench/tp_coldstart.py [--ranks 2,4] [--repeat 3] [--max-num-seqs 8]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from serverless import clean_env  # scripts/bench/, next to this file

from medusa.trace import recorder_env

SIM_DEVICE = "MEDUSA_SIM_DEVICE_INDEX"  # each rank's own simcuda board
# One rank: its place arrives on stdin (the communicator's id is never on a command line).
RANK = """
import json, sys, time
from medusa.engine.config import EngineConfig
from medusa.engine.llm_engine import LLMEngine
from medusa.engine.sampling import SamplingParams
from medusa.engine.tensor_parallel import TPRank
p = json.loads(sys.stdin.readline())
tp = TPRank(p["rank"], p["size"], bytes.fromhex(p["uid"]))
art = p["artifact"] or None
e = LLMEngine(EngineConfig(**p["config"]), artifact=art, require_artifact=bool(art),
              tensor_parallel=tp)
e.add_request(e.tokenizer.encode("Hello"), SamplingParams(max_tokens=1))
e.step()
print(json.dumps({"first_token_unix": time.time(), "timings": e.timings, "restored": e.restored}))
e.shutdown()
"""


def group(n: int, cfg: dict, artifact: str, work: Path) -> tuple[float, list[dict]]:
    """One start of N ranks: (seconds from their start to rank 0's first token, every rank's
    report)."""
    from medusa.cuda import load_backend
    from medusa.cuda.nccl import Nccl

    uid = Nccl(load_backend("sim")).unique_id().hex()
    env = clean_env()
    if artifact:
        env = recorder_env(work / "restore-%p.mtr", mode="restore", base=env)
    t0 = time.time()
    procs = [
        subprocess.Popen([sys.executable, "-c", RANK], env={**env, SIM_DEVICE: str(r)},
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True)
        for r in range(n)
    ]  # fmt: skip
    msg = {"size": n, "uid": uid, "config": cfg, "artifact": artifact}
    for r, p in enumerate(procs):  # NOTE: every rank told before any is waited for
        assert p.stdin is not None
        p.stdin.write(json.dumps({**msg, "rank": r}) + "\n")
        p.stdin.close()
    # NOTE: stderr joined to stdout: one pipe per rank, so no rank waits on a second pipe of its
    # own that this is not reading (its output is a few lines; the report is its last JSON line)
    outs = [p.stdout.read() for p in procs]  # type: ignore[union-attr]
    for r, (p, out) in enumerate(zip(procs, outs, strict=True)):
        if p.wait(timeout=900):
            sys.exit(f"rank {r} of a {'restored' if artifact else 'normal'} start failed:\n"
                     f"{out[-3000:]}")  # fmt: skip
    reports = [json.loads([x for x in o.splitlines() if x.startswith("{")][-1]) for o in outs]
    return reports[0]["first_token_unix"] - t0, reports


def materialize(n: int, cfg: dict, out: Path) -> None:
    args = ["--tensor-parallel-size", str(n), "--out", str(out)]
    for k, v in cfg.items():
        args += [f"--{k.replace('_', '-')}", str(v)]
    res = subprocess.run([sys.executable, "-m", "medusa.cli", "materialize", *args],
                         env=clean_env(), capture_output=True, text=True)  # fmt: skip
    if res.returncode:
        sys.exit(f"medusa materialize --tensor-parallel-size {n} failed:\n{res.stderr[-3000:]}")


def stage(reports: list[dict], *names: str) -> str:
    """A stage's seconds on each rank, 'a / b / ...' (the first of NAMES each rank ran)."""
    return " / ".join(f"{next(r['timings'][k] for k in names if k in r['timings']):.3f}"
                      for r in reports)  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", default="2,4", help="group sizes (default 2,4)")
    ap.add_argument("--repeat", type=int, default=3, help="starts of each kind; the median shown")
    ap.add_argument("--max-num-seqs", type=int, default=8, help="8 (default): sizes 1, 2, 4, 8")
    a = ap.parse_args()
    cfg = {"max_num_seqs": a.max_num_seqs, "max_model_len": 256, "max_num_batched_tokens": 64,
           "gpu_memory_utilization": 0.3}  # fmt: skip
    print(f"SmolLM2, simcuda, one process per rank; --max-num-seqs {a.max_num_seqs}; "
          f"median of {a.repeat} starts of each kind")  # fmt: skip
    print("| ranks | normal TTFT | restored TTFT | ratio | graph stage per rank, normal → "
          "restored (s) | KV sizing per rank, normal → restored (s) |")  # fmt: skip
    print("|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory(prefix="medusa-tp-bench-") as tmp:
        for n in (int(x) for x in a.ranks.split(",")):
            art = Path(tmp) / f"tp{n}"
            materialize(n, cfg, art)
            runs = {"": [], str(art): []}
            for _ in range(a.repeat):  # NOTE: interleaved: both kinds see the same load
                for kind, got in runs.items():
                    got.append(group(n, cfg, kind, Path(tmp)))
            (tn, rn), (tr, rr) = (sorted(v, key=lambda x: x[0])[len(v) // 2] for v in runs.values())
            if not all(r["restored"] for r in rr):
                sys.exit(f"{n} ranks: a rank did not restore")
            print(f"| {n} | {tn:.2f} s | {tr:.2f} s | {tn / tr:.2f}x | "
                  f"{stage(rn, 'graph_capture')} → {stage(rr, 'graph_restore')} | "
                  f"{stage(rn, 'kv_profile')} → {stage(rr, 'kv_restore')} |")  # fmt: skip


if __name__ == "__main__":
    main()
