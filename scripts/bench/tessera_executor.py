"""Tessera's executor on SmolLM2: its decode graphs split across two simcuda processes at random
kernel-to-device placements, the greedy tokens compared with one device's (issue 21: 100
placements, bit-identical); then one placement (half of each graph's nodes on each device) timed
with request groups one after another and pipelined across the two devices, side by side.
Each process is one device: its BLAS and OpenMP are held to one thread.
Run: python scripts/bench/tessera_executor.py [--placements 100] [--tokens 8]
                                              [--compare 3 --groups 2 --compare-tokens 16]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from medusa.child import python_module
from medusa.engine.config import EngineConfig
from medusa.tessera.record import record_instrumented
from medusa.trace import recorder_env

CONFIG = {"max_num_seqs": 2, "max_model_len": 256, "max_num_batched_tokens": 64,
          "kv_cache_memory": 32 << 20}  # fmt: skip
ONE_THREAD = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def prepare(tmp: Path) -> tuple[Path, Path]:
    art, trace = tmp / "art", tmp / "accesses.mtr"
    if art.exists() and trace.exists():
        return art, trace
    opts = [f"--{k.replace('_', '-')}={v}" for k, v in CONFIG.items()]
    t0 = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "medusa.cli", "materialize", *opts, "--no-weights",
         "--out", str(art)],
        check=True, capture_output=True,
    )  # fmt: skip
    record_instrumented(EngineConfig(**CONFIG), trace)  # type: ignore[arg-type]
    print(f"materialized and recorded the accesses in {time.perf_counter() - t0:.0f} s")
    return art, trace


def pair(tmp: Path, art: Path, trace: Path, *args: str) -> dict:  # type: ignore[type-arg]
    """Both sides of one partition_check; rank 0's JSON."""
    sock, procs = tmp / "exchange.sock", []
    sock.unlink(missing_ok=True)
    for rank in (0, 1):
        env = recorder_env(
            tmp / f"r{rank}-%p.mtr", mode="restore", base={**os.environ, **ONE_THREAD}
        )
        cmd = python_module(
            "medusa.tessera.partition_check", str(art), str(trace), str(rank), str(sock), *args
        )
        procs.append(subprocess.Popen(cmd, env=env, text=True, stdout=subprocess.PIPE))
        while rank == 0 and not sock.exists() and procs[0].poll() is None:
            time.sleep(0.05)
    outs = [p.communicate()[0] for p in procs]
    if any(p.returncode for p in procs):
        sys.exit("a partitioned process failed")
    return json.loads(outs[0].strip().splitlines()[-1])  # type: ignore[no-any-return]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--placements", type=int, default=100, help="0: skip the random placements")
    ap.add_argument("--tokens", type=int, default=8)
    ap.add_argument("--compare", type=int, default=3, help="timed runs of each way (0: skip)")
    ap.add_argument("--groups", type=int, default=2, help="request groups in flight")
    ap.add_argument("--compare-tokens", type=int, default=16)
    ap.add_argument("--keep", type=Path, help="keep (and reuse) the artifact and trace here")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = a.keep or Path(tmp_name)
        tmp.mkdir(parents=True, exist_ok=True)
        art, trace = prepare(tmp)
        if a.placements:
            r = pair(tmp, art, trace, "--placements", str(a.placements), "--tokens", str(a.tokens))
            same = r["placements"] - len(r["bad"])
            print(
                f"SmolLM2 decode graphs over two simcuda processes: {same}/{r['placements']} "
                f"random placements give one device's greedy tokens ({a.tokens} tokens, 2 "
                f"sequences); {r['segments']:.0f} segments per graph on average, "
                f"{r['seconds'] / r['placements']:.2f} s per placement"
            )
        if a.compare:
            load = os.getloadavg()
            r = pair(tmp, art, trace, "--compare", str(a.compare), "--groups", str(a.groups),
                     "--tokens", str(a.compare_tokens))  # fmt: skip
            rates = {k: statistics.median(v) for k, v in r["steps_per_s"].items()}
            busy = {k: statistics.median(v) for k, v in r["busy"].items()}
            print(
                f"one placement (half the nodes on each device, {r['segments']:.0f} segments "
                f"per graph), {a.groups} request groups x 2 sequences x {a.compare_tokens} "
                f"tokens, median of {a.compare}: unpipelined {rates['unpipelined']:.2f} decode "
                f"steps/s, pipelined {rates['pipelined']:.2f} steps/s: "
                f"{rates['pipelined'] / rates['unpipelined']:.2f}x; every group's tokens "
                f"{'equal' if r['same'] and r['alone'] else 'DIFFER FROM'} one device's"
            )
            print(
                f"  CPU share of device 0's process: unpipelined {busy['unpipelined']:.0%}, "
                f"pipelined {busy['pipelined']:.0%}; one device alone, unsplit: "
                f"{r['one_device_steps_per_s']:.2f} steps/s; load average before "
                f"{load[0]:.1f}, after {os.getloadavg()[0]:.1f} (2 cores, shared)"
            )
            print("  runs:", json.dumps({k: [round(x, 2) for x in v]
                                         for k, v in r["steps_per_s"].items()}))  # fmt: skip


if __name__ == "__main__":
    main()
