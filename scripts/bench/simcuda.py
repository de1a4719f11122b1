"""What simcuda itself costs: median µs per eager kernel launch from C and per replayed graph node.

Targets (issue 2): under 2 µs per launch, under 1 µs per replayed node.
Run: python scripts/bench/simcuda.py
"""

from __future__ import annotations

import argparse
import subprocess
import tempfile
from pathlib import Path

from medusa.cuda.toolchain import compile_program


def main() -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    src = Path(__file__).parent / "c" / "launch_cost.c"
    with tempfile.TemporaryDirectory() as tmp:
        prog = compile_program(src, Path(tmp), libs=("simcuda", "simcuda_testkernels"))
        eager, replay = map(
            float,
            subprocess.run([str(prog)], check=True, capture_output=True, text=True).stdout.split(),
        )
    print(f"{'measure':34} {'median µs':>10} {'target':>8}")
    print(f"{'eager launch (noop kernel, from C)':34} {eager:10.3f} {'< 2':>8}")
    print(f"{'graph replay, per node':34} {replay:10.3f} {'< 1':>8}")


if __name__ == "__main__":
    main()
