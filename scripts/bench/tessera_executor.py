"""Tessera's executor on SmolLM2: its decode graphs split across two simcuda processes at random
kernel-to-device placements, the greedy tokens compared with one device's (issue 21: 100
placements, bit-identical); then one placement (a cut balancing the bytes each device touches) timed
with request groups one after another and pipelined across the two devices, side by side, with
devices as fast as the CPU and slower (MEDUSA_SIM_SLOWDOWN: the rest of a kernel's time spent
off the CPU, as a GPU's is). Each process is one device: its BLAS is held to one thread.
Run: python scripts/bench/tessera_executor.py [--placements 100] [--tokens 8]
                                              [--compare 3 --groups 2 --compare-tokens 16]
                                              [--slowdown 1,4]
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
from medusa.progress import Progress
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


def pair(tmp: Path, art: Path, trace: Path, *args: str, slowdown: float = 1) -> dict:  # type: ignore[type-arg]
    """Both sides of one partition_check; rank 0's JSON. slowdown: both simcuda devices that
    many times slower than the CPU (their kernels' extra time spent off the CPU, as a GPU's)."""
    sock, procs = tmp / "exchange.sock", []
    sock.unlink(missing_ok=True)
    for rank in (0, 1):
        base = {**os.environ, **ONE_THREAD, "MEDUSA_SIM_SLOWDOWN": str(slowdown)}
        env = recorder_env(tmp / f"r{rank}-%p.mtr", mode="restore", base=base)
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
    ap.add_argument("--max-segment", type=int, default=12,
                    help="nodes per segment at most when timed (about one layer)")  # fmt: skip
    ap.add_argument("--slowdown", type=lambda v: [float(x) for x in v.split(",")],
                    default=[1.0, 4.0], help="devices this many times slower than the CPU, "
                    "each timed in turn (MEDUSA_SIM_SLOWDOWN)")  # fmt: skip
    ap.add_argument("--keep", type=Path, help="keep (and reuse) the artifact and trace here")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = a.keep or Path(tmp_name)
        tmp.mkdir(parents=True, exist_ok=True)
        progress = Progress()
        with progress.step("materializing SmolLM2 and recording its accesses"):
            art, trace = prepare(tmp)
        if a.placements:
            with progress.step(f"{a.placements} random placements over two processes"):
                r = pair(tmp, art, trace, "--placements", str(a.placements), "--tokens",
                         str(a.tokens))  # fmt: skip
            same = r["placements"] - len(r["bad"])
            print(
                f"SmolLM2 decode graphs over two simcuda processes: {same}/{r['placements']} "
                f"random placements give one device's greedy tokens ({a.tokens} tokens, 2 "
                f"sequences); {r['segments']:.0f} segments per graph on average, "
                f"{r['seconds'] / r['placements']:.2f} s per placement"
            )
        if a.compare:
            print(f"two busy processes at once here now: {concurrency():.2f}x the work of one "
                  "(the most that overlapping the two devices can give)")  # fmt: skip
            for f in a.slowdown:
                with progress.step(f"pipelined against unpipelined, devices {f:g}x slower"):
                    compare(tmp, art, trace, a, f)


def compare(tmp: Path, art: Path, trace: Path, a: argparse.Namespace, slowdown: float) -> None:
    load = os.getloadavg()
    r = pair(tmp, art, trace, "--compare", str(a.compare), "--groups", str(a.groups),
             "--tokens", str(a.compare_tokens), "--max-segment", str(a.max_segment),
             slowdown=slowdown)  # fmt: skip
    rates = {k: statistics.median(v) for k, v in r["steps_per_s"].items()}
    busy = {k: statistics.median(v) for k, v in r["busy"].items()}
    device = "as fast as the CPU" if slowdown == 1 else f"{slowdown:g}x slower than the CPU"
    print(
        f"devices {device}: one placement (a cut balancing the bytes each device touches, "
        f"{r['segments']:.0f} segments per graph of at most {a.max_segment} nodes), "
        f"{a.groups} request groups x 2 sequences x "
        f"{a.compare_tokens} tokens, median of {a.compare}: unpipelined "
        f"{rates['unpipelined']:.2f} decode steps/s, pipelined {rates['pipelined']:.2f} "
        f"steps/s: {rates['pipelined'] / rates['unpipelined']:.2f}x; every group's tokens "
        f"{'equal' if r['same'] and r['alone'] else 'DIFFER FROM'} one device's"
    )
    print(
        f"  CPU share of device 0's process: unpipelined {busy['unpipelined']:.0%}, "
        f"pipelined {busy['pipelined']:.0%}; one device alone, unsplit: "
        f"{r['one_device_steps_per_s']:.2f} steps/s; load average before {load[0]:.1f}, after "
        f"{os.getloadavg()[0]:.1f} (2 cores, shared)"
    )
    print("  runs:", json.dumps({k: [round(x, 2) for x in v]
                                 for k, v in r["steps_per_s"].items()}))  # fmt: skip


def concurrency(seconds: float = 3.0) -> float:
    """Work two CPU-bound processes get done at once over what one gets alone, now."""
    code = (f"import time\nt=time.perf_counter()+{seconds}\nn=0\n"
            "while time.perf_counter()<t: n+=1\nprint(n)")  # fmt: skip
    one = int(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout)
    two = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
           for _ in range(2)]  # fmt: skip
    return sum(int(p.communicate()[0]) for p in two) / one


if __name__ == "__main__":
    main()
