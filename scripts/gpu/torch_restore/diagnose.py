"""What check.py prints when `medusa materialize` fails: the program recorded twice more (the
second with the address shift materialize uses), and for each recording the interposer's own
lines (variants it could not hook, recording stopped) and the allocations by API, so that a
failure tells a missed allocation route from a value that merely differs between processes."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from pathlib import Path

from medusa.materialize.driver import SHIFT_BYTES
from medusa.trace import Ev, read_trace, recorder_env
from medusa.trace import records as R

KINDS = {
    "device": (R.Alloc, Ev.ALLOC),
    "host": (R.HostAlloc, Ev.HOST_ALLOC),
    "registered": (R.HostRegister, Ev.HOST_REGISTER),
    "vmm reserve": (R.VmmReserve, Ev.VMM_RESERVE),
    "vmm map": (R.VmmMap, Ev.VMM_MAP),
}


def summary(trace: Path) -> list[str]:
    t = read_trace(trace, allow_truncated=True)
    lines = []
    for kind, (cls, ev) in KINDS.items():
        apis = Counter(e.api for e in t.of(cls, ev))
        if apis:
            lines.append(f"  {kind} allocations by API: {dict(sorted(apis.items()))}")
    begins = Counter(e.api for e in t.of(R.CaptureBegin, Ev.CAPTURE_BEGIN))
    ends = [e.num_nodes for e in t.of(R.CaptureEnd, Ev.CAPTURE_END)]
    lines.append(f"  captures begun by API: {dict(begins)}; nodes per capture: {ends}")
    launches = Counter((e.api, "graph" if e.node else "eager") for e in t.of(R.Launch, Ev.LAUNCH))
    lines.append(
        "  launches by API/where: " + ", ".join(f"{a}/{w} {n}" for (a, w), n in launches.items())
    )
    return lines


def diagnose(program: list[str], work: Path, limit: int, env: dict[str, str]) -> None:
    """Records PROGRAM twice into WORK (each run bounded by LIMIT seconds) and prints what the
    recordings hold; never raises (the check has failed already)."""
    print("== diagnosis: the program recorded twice more, as materialize records it")
    for run in (0, 1):
        trace = work / f"diagnose-{run}.mtr"
        extra = {"MEDUSA_TRACE_SHIFT": str(SHIFT_BYTES)} if run else {}
        cmd = [*program, "record", "--ref", str(work / f"diagnose-ref-{run}")]
        try:
            res = subprocess.run(
                cmd,
                env={**recorder_env(trace, base=env), **extra},
                capture_output=True,
                text=True,
                timeout=limit,
            )
        except subprocess.TimeoutExpired:
            print(f"  run {run + 1}: ran past {limit} s")
            continue
        own = [x for x in res.stderr.splitlines() if x.startswith("medusa-interpose")]
        print(f"  run {run + 1}: exit {res.returncode}; the interposer said {len(own)} lines")
        for line in dict.fromkeys(own):  # each distinct line once
            print(f"    {line}")
        if res.returncode:
            print("\n".join("    " + x for x in res.stderr.strip().splitlines()[-15:]))
        try:
            print("\n".join(summary(trace)))
        except (OSError, ValueError) as e:  # TraceError is a ValueError
            print(f"  {trace}: unreadable: {e}")
    sys.stdout.flush()
