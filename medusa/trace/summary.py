"""`medusa trace summarize`: what a trace holds, in a few screens."""

from __future__ import annotations

from collections import Counter, defaultdict
from itertools import accumulate
from pathlib import Path

import numpy as np

from medusa.trace import records as R
from medusa.trace.format import Ev, NodeType
from medusa.trace.reader import Trace


def human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} GiB"


def live_memory(trace: Trace) -> tuple[np.ndarray, np.ndarray]:
    """(t_ns, live device bytes) after each device allocation or free, in order. The bytes are
    Python ints: sizes read from a file may be anything, and int64 sums of them would wrap."""
    rows = trace.select(Ev.ALLOC, Ev.FREE)
    rows = rows[rows["result"] == 0]
    sizes = rows["u"][:, 1].tolist()
    signed = [n if t == Ev.ALLOC else -n for t, n in zip(rows["type"].tolist(), sizes, strict=True)]
    return rows["t_ns"], np.array(list(accumulate(signed)), dtype=object)


def _timeline(trace: Trace, width: int = 10) -> list[str]:
    t, live = live_memory(trace)
    if not live.size:
        return ["  (no device allocations)"]
    out = [f"  peak {human(int(live.max()))}, at the end {human(int(live[-1]))}"]
    marks = [(e.t_ns, e.phase) for e in trace.of(R.Mark, Ev.MARK)]
    edges = np.linspace(0, int(t[-1]) + 1, width + 1)
    for lo, hi in zip(edges[:-1], edges[1:], strict=True):
        sel = live[(t >= lo) & (t < hi)]
        if not sel.size:
            continue
        names = ", ".join(p for mt, p in marks if lo <= mt < hi)
        bar = "#" * min(max(30 * int(sel.max()) // max(int(live.max()), 1), 0), 30)
        out.append(
            f"  {lo / 1e9:8.3f}s  {human(int(sel.max())):>11}  {bar}"
            + (f"  <{names}" if names else "")
        )
    return out


def _library_names(trace: Trace) -> dict[int, str]:
    """Library/module handle -> a readable name: the loaded file, else the image's hash. A
    library's kernels name its module (cuLibraryGetModule), not the library: key both."""
    names: dict[int, str] = {}
    for e in trace.of(R.Load, Ev.LOAD):
        label = Path(e.file).name if e.file else f"image {e.sha256[:12]}"
        names[e.handle] = label
        if e.module:
            names[e.module] = label
    return names


def _kernels(trace: Trace) -> list[str]:
    funcs = {f.func: f for f in trace.of(R.Func, Ev.FUNC)}
    stubs = {s.func: s for s in trace.of(R.Stub, Ev.STUB) if s.symbol}
    libs = _library_names(trace)
    launches = Counter(trace.select(Ev.LAUNCH)["u"][:, 0].tolist())
    nodes = Counter(
        int(r["u"][3]) for r in trace.select(Ev.NODE) if int(r["u"][2]) & 0xFFFFFFFF == 0
    )
    by_lib: dict[str, list[tuple[str, int, int]]] = defaultdict(list)
    for fh in sorted(set(launches) | set(nodes)):
        f = funcs.get(fh)
        lib = libs.get(f.library, libs.get(f.module, "?")) if f else "?"
        if fh in stubs:
            lib += f" ({Path(stubs[fh].object).name})"
        by_lib[lib].append((f.name if f else f"func {fh:#x}", launches[fh], nodes[fh]))
    out = []
    for lib, ks in sorted(by_lib.items()):
        out.append(f"  {lib}: {len(ks)} kernels")
        for name, n_launch, n_node in sorted(ks, key=lambda k: -k[1] - k[2]):
            out.append(f"    {n_launch:7d} launches  {n_node:5d} graph nodes  {name}")
    return out or ["  (no launches)"]


def _graphs(trace: Trace) -> list[str]:
    node_types: dict[int, Counter[str]] = defaultdict(Counter)
    for r in trace.select(Ev.NODE):
        t = int(r["u"][2]) & 0xFFFFFFFF
        name = NodeType(t).name.lower() if t in NodeType._value2member_map_ else str(t)
        node_types[int(r["u"][0])][name] += 1
    inst = Counter(int(r["u"][0]) for r in trace.select(Ev.INSTANTIATE) if r["result"] == 0)
    execs = {int(r["u"][1]): int(r["u"][0]) for r in trace.select(Ev.INSTANTIATE)}
    replays = Counter(execs.get(int(r["u"][0]), 0) for r in trace.select(Ev.GRAPH_LAUNCH))
    out = []
    for e in trace.of(R.CaptureEnd, Ev.CAPTURE_END):
        if e.result or not e.graph:
            out.append(f"  capture on stream {e.stream:#x} failed ({e.api} -> {e.result})")
            continue
        kinds = ", ".join(f"{n} {k}" for k, n in sorted(node_types[e.graph].items()))
        out.append(
            f"  graph {e.graph:#x}: {e.num_nodes} nodes ({kinds or 'none'}), {e.num_edges} edges, "
            f"instantiated {inst[e.graph]}x, replayed {replays[e.graph]}x"
        )
    return out or ["  (no captures)"]


def summarize(trace: Trace) -> str:
    lines = [
        f"trace {trace.path}: {len(trace)} records, pid {trace.pid}, mode {trace.mode.name.lower()}"
    ]
    if not trace.complete:
        lines.append("  NOTE: no END record: the process did not exit cleanly (killed? os._exit?)")
    proc = trace.of(R.Process, Ev.PROCESS)
    if proc:
        lines.append(f"  command: {' '.join(proc[0].argv)}")
    for d in trace.of(R.Device, Ev.DEVICE):
        lines.append(
            f"  device {d.ordinal}: {d.name}, {d.total_mem / (1 << 30):.1f} GiB, "
            f"cc {d.cc[0]}.{d.cc[1]}, {d.sm_count} SMs, driver {d.driver_version}"
        )
    if len(trace):
        lines.append(f"  duration {int(trace.records['t_ns'][-1]) / 1e9:.3f} s")
    lines.append("events:")
    types = Counter(trace.records["type"].tolist())
    apis = Counter(zip(trace.records["type"].tolist(), trace.records["api"].tolist(), strict=True))
    for t, n in sorted(types.items()):
        via = [f"{trace.api_name(a)} {k}" for (tt, a), k in sorted(apis.items()) if tt == t and a]
        detail = f"  ({', '.join(via)})" if t not in (Ev.PROCESS, Ev.APIS, Ev.END) and via else ""
        lines.append(f"  {Ev(t).name.lower():14s} {n:8d}{detail}")
    lines.append("live device memory:")
    lines += _timeline(trace)
    lines.append("kernels by library:")
    lines += _kernels(trace)
    lines.append("graphs:")
    lines += _graphs(trace)
    return "\n".join(lines)
