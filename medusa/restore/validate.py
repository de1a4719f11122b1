"""Checks a restore plan whole, once, before any C call reads it (`medusa verify` runs it too).

A plan comes from a file. Every index in it is checked against the table it indexes and every
offset against the size it lies in, with numpy over all nodes at once (no Python per node: this
runs on every restore). Beyond bounds, what a plan may make the restorer do is limited: it replays
allocations only of the phases the plan skips, saved contents go only into those replayed
allocations, and a relocation points only into an allocation (module global, VMM reservation) of the
kind it names, within that allocation's recorded size. The graph arrays are checked in
medusa.restore.graph_check."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from medusa.artifact.errors import ArtifactError
from medusa.artifact.layout import RELOC
from medusa.restore.graph_check import MAX_PARAM_BYTES, check_graphs
from medusa.restore.plan_records import MAX_TABLE, entries
from medusa.restore.plan_tables import PlanTables, Targets
from medusa.trace.run_view import DEVICE

U63 = 1 << 63
KEYS = {
    "allocs": list,
    "skipped_phases": list,
    "replay": list,
    "funcs": list,
    "globals": list,
    "vmm": list,
    "templates": list,
    "graphs": list,
    "contents": dict,
    "num_nodes": int,
    "relocations": dict,
}
FUNC = {"name": str, "sha256": str, "symbol": str, "layout": list, "attrs": list}
GLOBAL_ENTRY = {"sha256": str, "name": str, "size": int, "index": int}
VMM_ENTRY = {"index": int, "phase": str, "ordinal": int, "size": int}


def _columns(value: Any, where: str, width: int) -> list[tuple[Any, ...]]:
    """The columns of a list of `width`-item lists."""
    if type(value) is not list or len(value) > MAX_TABLE:
        raise ArtifactError(f"{where}: expected a list")
    if any(type(r) is not list or len(r) != width for r in value):
        raise ArtifactError(f"{where}: expected a list of {width}-item lists")
    return list(zip(*value, strict=True)) if value else [()] * width


def ints(col: Any, where: str, lo: int = 0, hi: int = U63) -> np.ndarray:
    """Integers (not booleans) in [lo, hi), as int64 (or uint64 when hi is above 2**63)."""
    if any(type(x) is not int for x in col) or (len(col) and (min(col) < lo or max(col) >= hi)):
        raise ArtifactError(f"{where}: expected integers in [{lo}, {hi})")
    return np.array(col, np.uint64 if hi > U63 else np.int64)


def _strs(col: Any, where: str) -> None:
    if any(type(x) is not str or len(x) > 4096 for x in col):
        raise ArtifactError(f"{where}: expected strings of at most 4096 characters")


def _sized_table(rows: list[dict[str, Any]], where: str) -> np.ndarray:
    """Recorded size by table index (-1 where the plan declares none), for globals and VMM."""
    index = ints([e["index"] for e in rows], f"{where} index", hi=MAX_TABLE)
    size = ints([e["size"] for e in rows], f"{where} size")
    if len(index) and np.bincount(index).max() > 1:
        raise ArtifactError(f"{where}: an index is listed twice")
    out = np.full(int(index.max()) + 1 if len(index) else 0, -1, np.int64)
    out[index] = size
    return out


def check_tables(plan: Any, resized: Mapping[int, int] | None = None) -> PlanTables:
    """The plan's top level, allocations, replay, kernels, globals and VMM reservations;
    `resized`: allocation index -> the size to check against instead of the recorded one."""
    if type(plan) is not dict or plan.keys() - {"scale"} != KEYS.keys():
        raise ArtifactError(f"expected an object with fields {list(KEYS)} (and scale)")
    for k, t in KEYS.items():
        if type(plan[k]) is not t:
            raise ArtifactError(f"{k}: expected {t.__name__}")
    phase, ordinal, kind, size, freed = _columns(plan["allocs"], "allocs", 5)
    _strs(phase, "allocs phase")
    ints(ordinal, "allocs ordinal")
    kinds = ints(kind, "allocs kind (device 0 or host-mapped 1)", hi=2)
    sizes = ints(size, "allocs size")
    for i, n in (resized or {}).items():
        sizes[i] = n
    if any(type(f) is not bool for f in freed):
        raise ArtifactError("allocs freed: expected booleans")
    _strs(plan["skipped_phases"], "skipped_phases")
    skip = set(plan["skipped_phases"])
    skipped = np.array([p in skip for p in phase], bool)
    funcs = entries(plan["funcs"], "funcs", FUNC)
    for i, f in enumerate(funcs):
        _strs((f["name"], f["sha256"], f["symbol"]), f"funcs[{i}]")
        a, v = _columns(f["attrs"], f"funcs[{i}].attrs", 2)
        ints(a, f"funcs[{i}].attrs id", hi=64)
        ints(v, f"funcs[{i}].attrs value", -(1 << 31), 1 << 31)
    layout_end = np.array([_layout_end(f["layout"], f"funcs[{i}].layout") for i, f in
                           enumerate(funcs)], np.int64)  # fmt: skip
    globs = entries(plan["globals"], "globals", GLOBAL_ENTRY)
    vmm = entries(plan["vmm"], "vmm", VMM_ENTRY)
    _strs([g["sha256"] for g in globs] + [g["name"] for g in globs], "globals")
    _strs([v["phase"] for v in vmm], "vmm phase")
    ints([v["ordinal"] for v in vmm], "vmm ordinal")
    targets = Targets.of(kinds, sizes, _sized_table(globs, "globals"), _sized_table(vmm, "vmm"))
    live = _check_replay(plan["replay"], skipped)
    tables = PlanTables(targets, len(funcs), layout_end, live, sizes)
    _check_contents(plan["contents"], tables)
    return tables


def _layout_end(layout: Any, where: str) -> int:
    """Where a kernel's last parameter ends (-1 for none): (offset, size) pairs within CUDA's
    limit on a kernel's parameter bytes, which the C builder turns into kernelParams."""
    offset, size = _columns(layout, where, 2)
    ends = ints(offset, f"{where} offsets", hi=MAX_PARAM_BYTES) + ints(
        size, f"{where} sizes", 1, MAX_PARAM_BYTES + 1
    )
    if len(ends) and ends.max() > MAX_PARAM_BYTES:
        raise ArtifactError(f"{where}: a parameter ends past {MAX_PARAM_BYTES} bytes")
    return int(ends.max()) if len(ends) else -1


def _check_replay(replay: Any, skipped: np.ndarray) -> np.ndarray:
    """Each allocation of a skipped phase allocated at most once, freed at most once, after its
    allocation; never one of a phase the engine runs (its own memory). Returns which stay."""
    op, idx = _columns(replay, "replay", 2)
    if any(o not in ("a", "f") for o in op):
        raise ArtifactError("replay: expected operations 'a' (allocate) or 'f' (free)")
    n = len(skipped)
    idx_a = ints(idx, "replay allocation", hi=n)
    is_a = np.array([o == "a" for o in op], bool)
    if len(idx_a) and not skipped[idx_a].all():
        i = int(idx_a[~skipped[idx_a]][0])
        raise ArtifactError(f"replay: allocation #{i} belongs to a phase the engine runs itself")
    pos = np.arange(len(idx_a))
    first_a, first_f = np.full(n, -1), np.full(n, -1)
    first_a[idx_a[is_a][::-1]] = pos[is_a][::-1]
    first_f[idx_a[~is_a][::-1]] = pos[~is_a][::-1]
    twice = np.bincount(idx_a[is_a], minlength=n) > 1
    twice |= np.bincount(idx_a[~is_a], minlength=n) > 1
    early = (first_f >= 0) & ((first_a < 0) | (first_f < first_a))
    bad = np.flatnonzero(twice | early)
    if bad.size:
        raise ArtifactError(
            f"replay: allocation #{bad[0]} is allocated or freed twice, or freed before allocated"
        )
    return (first_a >= 0) & (first_f < 0)  # type: ignore[no-any-return]


def _check_contents(contents: dict[Any, Any], t: PlanTables) -> None:
    for idx, c in contents.items():
        where = f"contents of allocation #{str(idx)[:20]}"
        if type(idx) is not int or not 0 <= idx < len(t.live_replayed) or not t.live_replayed[idx]:
            raise ArtifactError(
                f"{where}: saved contents may only fill an allocation the restorer replays and "
                "keeps; this one is the engine's own, freed, or not in the plan"
            )
        if type(c) is not dict or c.keys() != {"data", "relocs"} or type(c["data"]) is not bytes:
            raise ArtifactError(f"{where}: expected an object with bytes 'data' and 'relocs'")
        if len(c["data"]) > t.alloc_size[idx]:
            raise ArtifactError(
                f"{where}: {len(c['data'])} bytes saved for an allocation of {t.alloc_size[idx]}"
            )
        offset, kind, target, addend = _columns(c["relocs"], f"{where}, relocs", 4)
        off = ints(offset, f"{where}, relocation offsets", hi=1 << 32)
        if ((off % 8 != 0) | (off + 8 > len(c["data"]))).any():
            raise ArtifactError(f"{where}: a relocated word lies outside the saved bytes")
        relocs = np.zeros(len(off), [("kind", "<u4"), ("target", "<u8"), ("addend", "<i8")])
        relocs["kind"] = ints(kind, f"{where}, relocation kinds", hi=1 << 32)
        relocs["target"] = ints(target, f"{where}, relocation targets", hi=1 << 64)
        relocs["addend"] = ints(addend, f"{where}, relocation addends", -U63, U63)
        t.targets.check(relocs, where)


def validate_plan(plan: Any, source: str, sizes: Mapping[int, int] | None = None) -> None:
    """Raises ArtifactError naming `source` and the table, graph, node and field at fault, unless
    the restorer and the C graph builder can use the plan as it is (with the allocations of
    `sizes`, index -> bytes, at those sizes: a restore that sizes its KV cache for its device)."""
    try:
        check_graphs(plan, check_tables(plan, sizes))
        if "scale" in plan:
            _check_scale(plan)
    except ArtifactError as e:
        raise ArtifactError(f"{source}: restore plan: {e}; materialize again") from None


SCALE = {"phase": str, "count": int, "allocs": list, "relocs": list}
MAX_SLOPE = 1 << 40  # bytes per unit of the count: far beyond any KV block
MAX_COUNT = 1 << 32  # KV blocks


def _check_scale(plan: dict[str, Any]) -> None:
    """plan["scale"] (materialize.plan.build_plan): device allocations of one phase the restore
    runs, sized by a count, and relocations into them whose offset follows it, each naming a
    distinct relocation row of a template or graph that points into one of those allocations."""
    (sc,) = entries([plan["scale"]], "scale", SCALE)
    where = "scale"
    if not 0 < sc["count"] < MAX_COUNT:
        raise ArtifactError(f"{where}: count must be between 1 and {MAX_COUNT - 1}")
    if sc["phase"] in plan["skipped_phases"]:
        raise ArtifactError(f"{where}: phase {sc['phase'][:40]!r} is one the restore replays")
    allocs = ints(sc["allocs"], f"{where} allocs", hi=len(plan["allocs"]))
    for i in allocs.tolist():
        if plan["allocs"][i][0] != sc["phase"] or plan["allocs"][i][2] != DEVICE:
            raise ArtifactError(f"{where}: allocation #{i} is no device allocation of its phase")
    table, index, row, slope = _columns(sc["relocs"], f"{where} relocs", 4)
    table = ints(table, f"{where} relocs table", hi=2)
    ints(slope, f"{where} relocs slope", -MAX_SLOPE, MAX_SLOPE)
    index, row = ints(index, f"{where} relocs index"), ints(row, f"{where} relocs row")
    tables = (plan["templates"], plan["graphs"])
    keys = np.stack([table, index, row], 1) if len(table) else np.zeros((0, 3), np.int64)
    if len(np.unique(keys, axis=0)) != len(keys):
        raise ArtifactError(f"{where} relocs: a relocation is listed twice")
    for t in (0, 1):
        mine = table == t
        if (index[mine] >= len(tables[t])).any():
            raise ArtifactError(f"{where} relocs: no such template or graph")
        counts = np.array([len(x["relocs"]) // RELOC.itemsize for x in tables[t]], np.int64)
        starts = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
        if (row[mine] >= counts[index[mine]]).any():
            raise ArtifactError(f"{where} relocs: no such relocation row")
        if not mine.any():
            continue
        rel = np.frombuffer(b"".join(x["relocs"] for x in tables[t]), RELOC)
        hit = rel[starts[index[mine]] + row[mine]]
        inside = np.zeros(len(plan["allocs"]), bool)
        inside[allocs] = True
        if ((hit["kind"] != DEVICE) | ~inside[np.minimum(hit["target"], len(inside) - 1)]).any():
            raise ArtifactError(f"{where} relocs: one points outside the scaled allocations")
