"""Elastic KV against a static split, side by side: two SmolLM2 workers (two processes) on one
simulated slice of KV pages. Model A serves a short burst and goes idle; model B surges. Static:
each worker owns half the slice. Elastic: both reserve the whole slice and draw pages from one
ledger, so B maps what A gives back. Throughput is B's generated tokens per round (one engine step
per busy worker per round), so the figure does not depend on how loaded the host is.

Run: python scripts/bench/prism_kv.py [--slice-pages 24] [--surge 8]
"""

from __future__ import annotations

import argparse
import time

from lockstep import PAGE, Load, Trace, run_pair  # scripts/bench/, next to this file

from medusa.progress import Progress

BASE = {"max_model_len": 256, "max_num_seqs": 8, "max_num_batched_tokens": 512}


def scenario(surge: int) -> dict[str, list[Load]]:
    return {
        "A": [Load(count=3, prompt=40, tokens=16)],
        "B": [
            Load(count=1, prompt=16, tokens=8),
            Load(count=surge, prompt=64, tokens=48, at_round=2),
        ],
    }


def summary(traces: list[Trace]) -> dict[str, float]:
    a, b = traces
    idle = a.rounds_busy(0)
    rounds = b.rounds_busy(2)
    return {
        "a_idle_round": idle,
        "b_rounds": rounds,
        "b_tokens_per_round": sum(b.tokens[2:]) / rounds,
        "b_peak_pages": max(b.mapped),
        "mismatches": len(a.mismatches) + len(b.mismatches),
        "errors": len(a.errors) + len(b.errors),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--slice-pages", type=int, default=24, help="KV pages of 2 MiB in the slice")
    ap.add_argument("--surge", type=int, default=8, help="B's surge: requests")
    args = ap.parse_args()
    loads = scenario(args.surge)
    out = {}
    with Progress(steps=4) as progress:
        for kind in ("static", "elastic"):
            t0 = time.perf_counter()
            out[kind] = summary(run_pair(kind, args.slice_pages, loads, BASE, progress=progress))
            out[kind]["wall_s"] = time.perf_counter() - t0
    mib = args.slice_pages * PAGE >> 20
    print(f"slice: {args.slice_pages} pages ({mib} MiB of KV); A: 3 x (40 + 16) tokens, "
          f"B: {args.surge} x (64 + 48) tokens from round 2")  # fmt: skip
    print(f"{'':8}{'A idle at':>10}{'B rounds':>10}{'B tok/round':>13}{'B peak pages':>14}"
          f"{'ledger!=live':>14}{'errors':>8}{'wall s':>8}")  # fmt: skip
    for kind, s in out.items():
        peak = s["b_peak_pages"] or f"{args.slice_pages // 2} (all)"
        print(f"{kind:8}{s['a_idle_round']:>10}{s['b_rounds']:>10}"
              f"{s['b_tokens_per_round']:>13.2f}{peak:>14}{s['mismatches']:>14}{s['errors']:>8}"
              f"{s['wall_s']:>8.1f}")  # fmt: skip
    ratio = out["elastic"]["b_tokens_per_round"] / out["static"]["b_tokens_per_round"]
    print(f"B's throughput, elastic / static split: {ratio:.2f}x")


if __name__ == "__main__":
    main()
