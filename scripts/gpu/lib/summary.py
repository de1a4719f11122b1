"""scripts/gpu/all.sh's ending: from its steps.tsv and each step's log, the figure each check
exists for; writes LOGS/summary.json and prints the table. Exit status 1 if a step failed.
Standard library only (it runs with the machine's python, before or without any install).

  python3 scripts/gpu/lib/summary.py LOGS --phase 1 --bound-total 475
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path


def _lines(text: str, *starts: str) -> str:
    """The log's lines that begin with any of STARTS, joined by '; '."""
    return "; ".join(ln.strip() for ln in text.splitlines() if ln.startswith(starts))


def _setup(text: str) -> str:
    done = [ln[3:].strip() for ln in text.splitlines() if ln.startswith("=> ")]
    return done[-1] if done else ""


def _interpose(text: str) -> str:
    m = re.search(r"^graph kernels: \[(.*)\]$", text, re.M)
    if not m or "interpose_torch: ok" not in text:
        return ""
    return (
        f"{len([k for k in m[1].split(',') if k.strip()])} graph kernels recorded, result unchanged"
    )


def _restore(text: str) -> str:
    parts = []
    m = re.search(r"^time to first token after process start: baseline ([\d.]+) s, "
                  r"medusa ([\d.]+) s \(([\d.]+)x", text, re.M)  # fmt: skip
    if m:
        parts.append(f"TTFT after process start: baseline {m[1]} s, restored {m[2]} s ({m[3]}x)")
    m = re.search(
        r"^graph stage per 1000 nodes: capture ([\d.]+) ms, restore ([\d.]+) ms", text, re.M
    )
    if m:
        parts.append(f"graph stage per 1000 nodes: capture {m[1]} ms vs restore {m[2]} ms")
    m = re.search(r"^restored time to first token ([\d.]+) s: ([\d.]+)x the serial floor, "
                  r"([\d.]+)x the overlapped one", text, re.M)  # fmt: skip
    if m:
        parts.append(f"restored TTFT {m[1]} s = {m[2]}x the floor ({m[3]}x overlapped)")
    parts.append(_lines(text, "restore_parity: identical"))
    return "; ".join(p for p in parts if p)


def _gb_s(text: str) -> str:
    """HybridGEMM: each alpha 0.50 / cuBLAS / memcpy line's label and first GB/s figure."""
    out = []
    for ln in text.splitlines():
        m = re.match(r"(alpha 0\.50|cuBLAS|cudaMemcpy|memcpy)\b.*?([\d.]+ GB/s)", ln)
        if m:
            out.append(f"{m[1]} {m[2]}")
    return "; ".join(out)


def _torch(text: str) -> str:
    return _lines(text, "torch restore: bit-identical", "capture vs restore per 1000 nodes:")


def _simcuda(text: str) -> str:
    same = len(re.findall(r"^parity \S+: identical", text, re.M))
    total = len(re.findall(r"^parity ", text, re.M))
    return f"{same}/{total} programs print the same" if total else ""


FIGURES: dict[str, Callable[[str], str]] = {
    "interpose_torch": _interpose,
    "engine_parity": lambda t: _lines(t, "identical greedy answers:", "generate seconds:"),
    "restore_parity": _restore,
    "simcuda_parity": _simcuda,
    "hybridgemm_bandwidth": _gb_s,
    "tessera_ptx": lambda t: _lines(t, "ok:", "MISMATCH"),
    "weaver": lambda t: _lines(t, "spinning poll", "weaver engine tests"),
    "torch_restore": _torch,
    "weight_store": lambda t: _lines(t, "weight store vs cudaMemcpy from pinned memory:"),
    "kv_slices": lambda t: _lines(t, "largest difference"),
    "vllm_coldstart": lambda t: re.sub(
        r"\s+", " ", _lines(t, "init engine: medusa", "medusa restore FELL BACK")
    ),
}


def figure(step: str, kind: str, log: Path) -> str:
    if not log.is_file():
        return ""
    text = log.read_text(errors="replace")
    if kind == "setup":
        return _setup(text)
    fn = FIGURES.get(step.removesuffix("_smollm2"))
    return fn(text) if fn else ""


def read_steps(logs: Path) -> list[dict]:
    rows = []
    for line in (logs / "steps.tsv").read_text().splitlines():
        name, kind, status, secs, reason = (line.split("\t") + [""] * 5)[:5]
        fig = figure(name, kind, logs / f"{name}.log")
        rows.append({"check": name, "kind": kind, "status": status,
                     "seconds": float(secs) if secs else None, "figure": fig,
                     "reason": reason})  # fmt: skip
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("logs", type=Path)
    ap.add_argument("--phase", default="all")
    ap.add_argument("--bound-total", type=int, default=0)
    args = ap.parse_args()
    rows = read_steps(args.logs)
    summary = {"phase": args.phase, "host": platform.node(),
               "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
               "bounds_total_seconds": args.bound_total, "checks": rows}  # fmt: skip
    (args.logs / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(f"\n{'check':24} {'status':8} {'seconds':>7}  figure (ok) or reason")
    for r in rows:
        secs = "-" if r["seconds"] is None else f"{r['seconds']:.0f}"
        print(f"{r['check']:24} {r['status']:8} {secs:>7}  {r['reason'] or r['figure']}")
    return 1 if any(r["status"] == "FAILED" for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
