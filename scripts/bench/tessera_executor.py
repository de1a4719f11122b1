"""Tessera's executor on SmolLM2: its decode graphs split across two simcuda processes at random
kernel-to-device placements, the greedy tokens compared with one device's (issue 21: 100
placements, bit-identical), and what a split step costs here next to an unsplit one.
Run: python scripts/bench/tessera_executor.py [--placements 100] [--tokens 8]
"""

from __future__ import annotations

import argparse
import json
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--placements", type=int, default=100)
    ap.add_argument("--tokens", type=int, default=8)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        opts = [f"--{k.replace('_', '-')}={v}" for k, v in CONFIG.items()]
        t0 = time.perf_counter()
        subprocess.run(
            [sys.executable, "-m", "medusa.cli", "materialize", *opts, "--no-weights",
             "--out", str(tmp / "art")],
            check=True, capture_output=True,
        )  # fmt: skip
        trace = tmp / "accesses.mtr"
        record_instrumented(EngineConfig(**CONFIG), trace)  # type: ignore[arg-type]
        print(f"materialized and recorded the accesses in {time.perf_counter() - t0:.0f} s")
        sock, procs = tmp / "exchange.sock", []
        for rank in (0, 1):
            env = recorder_env(tmp / f"r{rank}-%p.mtr", mode="restore")
            cmd = python_module(
                "medusa.tessera.partition_check", str(tmp / "art"), str(trace), str(rank),
                str(sock), "--placements", str(a.placements), "--tokens", str(a.tokens),
            )  # fmt: skip
            procs.append(subprocess.Popen(cmd, env=env, text=True, stdout=subprocess.PIPE))
            while rank == 0 and not sock.exists() and procs[0].poll() is None:
                time.sleep(0.05)
        outs = [p.communicate()[0] for p in procs]
        if any(p.returncode for p in procs):
            sys.exit("a partitioned process failed")
    r = json.loads(outs[0].strip().splitlines()[-1])
    same = r["placements"] - len(r["bad"])
    print(
        f"SmolLM2 decode graphs over two simcuda processes: {same}/{r['placements']} random "
        f"placements give one device's greedy tokens ({a.tokens} tokens, 2 sequences); "
        f"{r['segments']:.0f} segments per graph on average, "
        f"{r['seconds'] / r['placements']:.2f} s per placement"
    )


if __name__ == "__main__":
    main()
