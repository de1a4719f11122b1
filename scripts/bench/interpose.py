"""What the recorder costs: per-call overhead of hooked cudaMalloc/cudaFree and cudaLaunchKernel
with vs without it (simcuda, side by side in one run), trace bytes per event, and how fast the
Python reader parses a trace of about a million events.

Targets (issue 3): under 1 µs added per call (median); 1 million events parse in under 2 s.
Run: python scripts/bench/interpose.py [--calls N]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import tempfile
import time
from pathlib import Path

from medusa.cuda.toolchain import compile_program
from medusa.trace import read_trace, recorder_env


def measure(prog: Path, calls: int, env: dict[str, str]) -> tuple[float, float]:
    out = subprocess.run(
        [str(prog), str(calls)], check=True, capture_output=True, text=True, env=env
    )
    alloc, launch = map(float, out.stdout.split())
    return alloc, launch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=2000, help="calls per round (31 rounds)")
    args = ap.parse_args()
    src = Path(__file__).parent / "c" / "hook_cost.c"
    with tempfile.TemporaryDirectory() as tmp:
        prog = compile_program(src, Path(tmp), libs=("simcuda", "simcuda_testkernels"))
        plain = measure(prog, args.calls, dict(os.environ))
        trace = Path(tmp) / "bench.mtr"
        rec = measure(prog, args.calls, recorder_env(trace))
        t0 = time.perf_counter()
        t = read_trace(trace)
        parse_s = time.perf_counter() - t0
        size = trace.stat().st_size + trace.with_name(trace.name + ".blobs").stat().st_size
        t0 = time.perf_counter()
        typed = len(list(t.events()))
        typed_s = time.perf_counter() - t0 + parse_s
    print(f"{'call':28} {'plain µs':>9} {'recorded µs':>12} {'added µs':>9} {'ratio':>6}  target")
    for name, p, r in (
        ("cudaMalloc / cudaFree", plain[0], rec[0]),
        ("cudaLaunchKernel", plain[1], rec[1]),
    ):
        print(f"{name:28} {p:9.3f} {r:12.3f} {r - p:9.3f} {r / p:6.2f}  < 1 µs added")
    n = len(t)
    print(f"trace: {n} events, {size / n:.1f} bytes per event (96-byte record + blobs)")
    print(f"read + validate: {parse_s:.2f} s ({parse_s * 1e6 / n:.2f} µs/event)")
    print(
        f"read + typed records: {typed_s:.2f} s for {typed} events, "
        f"{typed_s * 1e6 / max(typed, 1):.2f} s per million (target < 2 s)"
    )


if __name__ == "__main__":
    main()
