"""Superchip serving, simulated: p99 TTFT of each policy against its alternative, one policy
changed at a time, on a bursty multi-model trace over 7 GH200 MIG slices; and HybridGEMM's
modelled C2C and HBM bytes against alpha for the paper's shape.

C2CServe reports smart vs random placement 1.94x, tuned vs default chunk 2.83x, tuned vs static
alpha 1.48x. Run: python scripts/bench/c2c.py [--duration 60] [--rate 1.0] [--seeds 3]
"""

from __future__ import annotations

import argparse
import copy

import numpy as np

from medusa.c2c.link_simulator import DEFAULT_MODELS, DEFAULT_SLICES, Policy, bursty_trace, simulate
from medusa.c2c.model import GH200_MIG, gemm_traffic
from medusa.engine.hybrid_gemm import Tiles


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--duration", type=float, default=60.0)
    ap.add_argument("--rate", type=float, default=1.0)
    ap.add_argument("--cv", type=float, default=3.0)
    ap.add_argument("--seeds", type=int, default=3, help="traces averaged (geometric mean)")
    a = ap.parse_args()
    slices = [GH200_MIG[p] for p in DEFAULT_SLICES.split(",")]
    models = list(DEFAULT_MODELS)
    best = Policy()
    pairs = {
        "placement (bandwidth-aware vs random)": Policy(placement="random"),
        "prefill chunk (tuned vs default 256)": Policy(chunk="default"),
        "alpha (tuned vs static 1.0)": Policy(alpha="static"),
    }
    print(f"{'policy':40} {'tuned p99 TTFT':>15} {'other':>10} {'ratio':>7}")
    for name, other in pairs.items():
        ours, theirs = [], []
        for seed in range(a.seeds):
            trace = bursty_trace(models, a.duration, a.rate, a.cv, seed)
            ours.append(simulate(models, slices, copy.deepcopy(trace), best, seed=seed)["p99_ttft"])
            theirs.append(
                simulate(models, slices, copy.deepcopy(trace), other, seed=seed)["p99_ttft"]
            )
        ratios = np.array(theirs) / np.array(ours)
        gm = float(np.exp(np.log(ratios).mean()))
        print(f"{name:40} {np.mean(ours):14.2f}s {np.mean(theirs):9.2f}s {gm:6.2f}x")
    print("\nHybridGEMM, A 10240x4096 . B^T with B 16384x4096 (bf16), 256x256 tiles:")
    tiles = Tiles(bm=256, bn=256, bk=64, wbm=256, wbn=256, wbk=64)
    print(f"{'alpha':>6} {'C2C GB':>8} {'HBM GB':>8}")
    for alpha in (1.0, 0.75, 0.5, 0.25, 0.0):
        t = gemm_traffic(10240, 16384, 4096, alpha, tiles, elem=2)
        print(f"{alpha:6.2f} {t.c2c_read / 1e9:8.2f} {t.hbm / 1e9:8.2f}")


if __name__ == "__main__":
    main()
