"""What simcuda itself costs, with and without its race checker: median µs per eager kernel launch
from C (queued, then run by the synchronization after a batch), per replayed graph node (launch
and synchronization, per node), and ms per 512 MiB upload from pageable memory (cudaMemcpy).

Targets (issue 2): under 2 µs per launch, under 1 µs per replayed node.
Run: python scripts/bench/simcuda.py [--compare-lib DIR]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import tempfile
from pathlib import Path

from medusa.cuda.toolchain import compile_program

MEASURES = (
    ("eager launch (noop kernel, from C), µs", "< 2"),
    ("graph replay, per node, µs", "< 1"),
    ("512 MiB upload (cudaMemcpy), ms", ""),
)


def measure(prog: Path, racecheck: bool, lib_dir: Path | None = None) -> list[float]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEDUSA_SIM_")}
    env["MEDUSA_SIM_RACECHECK"] = "1" if racecheck else "0"
    if lib_dir is not None:  # the program's runpath yields to LD_LIBRARY_PATH
        env["LD_LIBRARY_PATH"] = str(lib_dir)
    out = subprocess.run([str(prog)], check=True, capture_output=True, text=True, env=env).stdout
    return [float(v) for v in out.split()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--compare-lib",
        type=Path,
        help="also run against the libsimcuda.so and libsimcuda_testkernels.so in this directory "
        "(another build), in a third column",
    )
    args = ap.parse_args()
    src = Path(__file__).parent / "c" / "launch_cost.c"
    with tempfile.TemporaryDirectory() as tmp:
        prog = compile_program(src, Path(tmp), libs=("simcuda", "simcuda_testkernels"))
        off, on = measure(prog, False), measure(prog, True)
        other = measure(prog, False, args.compare_lib) if args.compare_lib else None
    head = f"{'measure':40} {'checker off':>12} {'checker on':>11} {'on/off':>7}"
    print(head + (f" {'compared':>9}" if other else "") + f" {'target':>7}")
    for i, (name, target) in enumerate(MEASURES):
        row = f"{name:40} {off[i]:12.3f} {on[i]:11.3f} {on[i] / off[i]:6.2f}x"
        print(row + (f" {other[i]:9.3f}" if other else "") + f" {target:>7}")


if __name__ == "__main__":
    main()
