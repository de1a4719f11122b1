"""One program's decode CUDA graphs, recorded or restored through Medusa, their outputs compared.

A workload is a program that owns its device memory the way PyTorch does (a caching allocator
carving cudaMalloc'd segments, a graph pool shared by its captures, a GEMM library's hidden
kernels): decoder.py here (PyTorch, a GPU), and its simcuda twin in
tests/restore/programs/caching_allocator.py. Both run through main():

  PROGRAM record --ref DIR                   set up, capture one graph per batch size, replay
                                             them; write their outputs and the capture time to DIR
  PROGRAM restore --artifact ART --ref DIR   set up, restore the graphs from ART instead (under
                                             the recorder in restore mode), replay them on the
                                             current stream, compare with every run in DIR

The phases the program marks are what `medusa materialize --command --skip-phase graph_capture`
and the restore agree on: "setup" (weights, static buffers, a warm-up of every batch size that
loads the hidden kernels and makes the per-stream workspace, cached blocks released) runs in
both; "graph_capture" is what the restore skips, its allocations (the graph pool's segments)
replayed by the Restorer. The restore's last two lines are the figures check.py relays.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from medusa.artifact import load_artifact
from medusa.cuda.backend import Backend
from medusa.trace import control as trace

SETUP, CAPTURE, RESTORE = "setup", "graph_capture", "graph_restore"
STEPS = 2  # decode steps replayed per graph: the second reads what the first wrote


class Workload(Protocol):
    label: str  # the figure line's name: "<label>: bit-identical N/N graphs"
    batch_sizes: tuple[int, ...]  # one graph each, captured in this order

    def setup(self) -> None: ...
    def capture(self, batch: int) -> Any: ...  # a graph its replay() takes
    def replay(self, graph: Any) -> None: ...
    def backend(self) -> Backend: ...  # after setup: the CUDA runtime the program uses
    def stream(self) -> int: ...  # the stream restored graphs are built and launched on
    def step(self, batch: int, step: int, run: Callable[[], None]) -> bytes: ...
    def synchronize(self) -> None: ...


def outputs(w: Workload, runners: Sequence[Callable[[], None]]) -> list[bytes]:
    """Each graph's output bytes over STEPS decode steps, graphs in capture order."""
    return [
        b"".join(w.step(batch, s, run) for s in range(STEPS))
        for batch, run in zip(w.batch_sizes, runners, strict=True)
    ]


def record(w: Workload, ref: Path) -> int:
    trace.mark(SETUP)
    w.setup()
    trace.mark(CAPTURE)
    t0 = time.perf_counter()
    graphs = [w.capture(batch) for batch in w.batch_sizes]
    w.synchronize()
    seconds = time.perf_counter() - t0
    trace.mark("ready")  # the recorder saves the capture phase's buffers here
    outs = outputs(w, [functools.partial(w.replay, g) for g in graphs])
    info = {"recorded": trace.active(), "capture_s": seconds, "batch_sizes": list(w.batch_sizes)}
    _write_ref(ref, outs, info)
    print(f"captured {len(graphs)} graphs in {seconds * 1e3:.1f} ms; outputs written to {ref}")
    return 0


def _write_ref(ref: Path, outs: list[bytes], info: dict[str, Any]) -> None:
    ref.mkdir(mode=0o700, parents=True, exist_ok=True)
    stem = ref / f"run-{os.getpid()}"
    with open(stem.with_suffix(".npz"), "xb") as f:  # NOTE: a name taken is never overwritten
        np.savez(f, *(np.frombuffer(o, np.uint8) for o in outs))  # arr_0, arr_1, ...
    with open(stem.with_suffix(".json"), "x") as f:
        json.dump(info, f)


def _read_refs(ref: Path, batch_sizes: list[int]) -> list[tuple[str, dict, list[bytes]]]:
    runs = []
    for meta in sorted(ref.glob("run-*.json")):
        info = json.loads(meta.read_text())
        if info["batch_sizes"] != batch_sizes:
            raise ValueError(f"{meta}: batch sizes {info['batch_sizes']}, expected {batch_sizes}")
        with np.load(meta.with_suffix(".npz"), allow_pickle=False) as z:
            outs = [z[f"arr_{i}"].tobytes() for i in range(len(batch_sizes))]
        runs.append((meta.stem, info, outs))
    if not runs:
        raise ValueError(f"{ref} holds no capturing run (run-*.json): run `record` first")
    return runs


def _difference(got: bytes, want: bytes) -> str:
    if len(got) != len(want):
        return f"{len(got)} bytes, {len(want)} recorded"
    a, b = np.frombuffer(got, np.uint8), np.frombuffer(want, np.uint8)
    bad = np.flatnonzero(a != b)
    return f"{bad.size} of {a.size} bytes differ, the first at byte {int(bad[0])}"


def compare(w: Workload, outs: list[bytes], runs: list[tuple[str, dict, list[bytes]]]) -> int:
    """Prints one line per graph; returns how many are bit-identical to every capturing run."""
    same = 0
    for i, (batch, got) in enumerate(zip(w.batch_sizes, outs, strict=True)):
        off = [(name, _difference(got, r[i])) for name, _, r in runs if r[i] != got]
        if not off:
            same += 1
            print(f"graph {i} (batch {batch}): bit-identical to its capture in {len(runs)} runs")
            continue
        print(f"MISMATCH: graph {i} (batch {batch}): " + "; ".join(f"{n}: {d}" for n, d in off))
        if len({r[i] for _, _, r in runs}) > 1:
            print(f"  the capturing runs disagree with each other on graph {i} too")
    return same


def restore(w: Workload, art_dir: Path, ref: Path) -> int:
    from medusa.restore import Restorer

    runs = _read_refs(ref, list(w.batch_sizes))  # a bad DIR fails before the device is touched
    trace.mark(SETUP)
    w.setup()
    trace.mark(RESTORE)
    t0 = time.perf_counter()
    art = load_artifact(art_dir)
    loaded = time.perf_counter() - t0
    restorer = Restorer(art, w.backend())
    result = restorer.restore(w.stream())
    w.synchronize()
    seconds = time.perf_counter() - t0
    if len(result.execs) != len(w.batch_sizes):
        print(
            f"FAILED: the artifact holds {len(result.execs)} graphs, the program captures "
            f"{len(w.batch_sizes)} (batch sizes {list(w.batch_sizes)})"
        )
        return 1
    launch = w.backend().graph_launch
    outs = outputs(w, [functools.partial(launch, e, w.stream()) for e in result.execs])
    same = compare(w, outs, runs)
    nodes = int(art.plan["num_nodes"])
    t = {"load": loaded, **result.timings}
    print(
        f"restored {len(result.execs)} graphs ({nodes} nodes) in {seconds * 1e3:.1f} ms: "
        + ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in t.items())
        + f"; kernels found by {dict(result.methods)}"
    )
    plain = [r[1]["capture_s"] for r in runs if not r[1]["recorded"]]
    capture = min(plain or [r[1]["capture_s"] for r in runs])
    print(f"captured them in {capture * 1e3:.1f} ms ({'un' if plain else ''}recorded run)")
    per = 1e6 / max(nodes, 1)
    print(f"{w.label}: bit-identical {same}/{len(outs)} graphs")
    print(f"capture vs restore per 1000 nodes: {capture * per:.1f} ms vs {seconds * per:.1f} ms")
    return 0 if same == len(outs) and outs else 1


def main(
    make: Callable[[], Workload],
    argv: Sequence[str] | None = None,
    unavailable: Callable[[], str | None] = lambda: None,
) -> int:
    """The program's entry point; `unavailable` says why it cannot run here (then it prints
    "skipped: WHY" and exits 0)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("mode", choices=["record", "restore"])
    ap.add_argument("--ref", type=Path, required=True, help="directory of recorded outputs")
    ap.add_argument("--artifact", type=Path, help="restore: the materialized artifact")
    args = ap.parse_args(argv)
    if args.mode == "restore" and args.artifact is None:
        ap.error("restore needs --artifact DIR (from medusa materialize --command)")
    why = unavailable()
    if why:
        print(f"skipped: {why}")
        return 0
    w = make()
    try:
        if args.mode == "record":
            return record(w, args.ref)
        return restore(w, args.artifact, args.ref)
    # NOTE: what a restore can raise (RestoreError, CudaError: RuntimeError; ArtifactError:
    # ValueError; a missing library: OSError) is reported as the check's failure, not a trace.
    except (RuntimeError, ValueError, OSError) as e:
        print(f"FAILED: {args.mode}: {type(e).__name__}: {e}", flush=True)
        return 1


if __name__ == "__main__":
    sys.exit("harness.py is imported by a workload program (decoder.py), not run")
