"""`medusa simulate --weaving`: the table (medusa/cli.py wires the option to simulate_weaving)."""

from __future__ import annotations

import json
from collections.abc import Callable

from medusa.weaver.weaving_simulator import PAPER, PROFILES, Profile, Result, balanced_hol, compare


def simulate_weaving(
    profiles: str = "simcuda,a100,l40s",
    ratio: float = 0.45,
    cold_budget: float = 0.10,
    as_json: bool = False,
    echo: Callable[[str], None] = print,
) -> dict[str, dict[str, dict[str, float]]]:
    """Prints, per device profile, each policy's hot batch, hot TPOT and throughput (and against
    dedicated and multiplexing), cold TPOT (and against dedicated) and the hot model's
    head-of-line wait per layer with and without operator splitting. Raises ValueError for an
    unknown profile or a ratio outside [0, 1]."""
    names = [n.strip() for n in profiles.split(",") if n.strip()]
    unknown = [n for n in names if n not in PROFILES]
    if unknown or not names:
        raise ValueError(f"--profiles {profiles!r}: unknown {unknown}; known: {sorted(PROFILES)}")
    if not 0.0 <= ratio <= 1.0 or cold_budget < 0:
        raise ValueError(f"--ratio {ratio} must be in [0, 1] and --cold-budget >= 0")
    out: dict[str, dict[str, dict[str, float]]] = {}
    for name in names:
        p = PROFILES[name]
        rows = compare(p, ratio, cold_budget)
        out[name] = {k: {"ratio": r.ratio, "hot_batch": r.hot_batch, "hot_tpot": r.hot_tpot,
                         "hot_tput": r.hot_tput, "cold_tpot": r.cold_tpot, "wait": r.wait,
                         "wait_unsplit": r.wait_unsplit, "splits": r.splits}
                     for k, r in rows.items()}  # fmt: skip
        if as_json:
            continue
        _echo_profile(name, p, rows, ratio, echo)
    if as_json:
        echo(json.dumps(out, indent=2))
    return out


def _echo_profile(
    name: str, p: Profile, rows: dict[str, Result], ratio: float, echo: Callable[[str], None]
) -> None:
    """One profile's table, its head-of-line line and the paper's figures for it."""
    ded, mux = rows["dedicated"], rows["multiplexing"]
    echo(f"{name}: {p.source}")
    echo(f"  {'policy':13} {'ratio':>5} {'batch':>6} {'hot TPOT ms':>11} {'hot tok/s':>10} "
         f"{'vs ded':>7} {'vs mux':>7} {'cold TPOT ms':>12} {'cold vs ded':>11} "
         f"{'HOL wait us (unsplit)':>22}")  # fmt: skip
    for key, r in rows.items():
        hol = f"{r.wait * 1e6:.0f} ({r.wait_unsplit * 1e6:.0f})" if key.startswith("w") else ""
        echo(f"  {key:13} {r.ratio:5.2f} {r.hot_batch:6d} {r.hot_tpot * 1e3:11.2f} "
             f"{r.hot_tput:10.0f} {r.hot_tput / ded.hot_tput:6.2f}x "
             f"{r.hot_tput / mux.hot_tput:6.2f}x {r.cold_tpot * 1e3:12.2f} "
             f"{r.cold_tpot / ded.cold_tpot - 1:+10.0%} {hol:>22}")  # fmt: skip
    unsplit, split = balanced_hol(p, ratio)
    target = 0.05 * rows[f"weaving {ratio:g}"].hot_tpot / p.layers
    echo(f"  head-of-line at K = N, cold busy: {unsplit.wait * 1e6:.0f} us per layer "
         f"unsplit, {split.wait * 1e6:.0f} us split ({split.extra_launches} more kernels "
         f"per layer; target {target * 1e6:.0f} us)")  # fmt: skip
    if name in PAPER:
        echo(f"  paper: {PAPER[name]}")
