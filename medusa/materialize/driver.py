"""`medusa materialize`: record a start-up twice (the second time with the address layout
shifted), analyze the two recordings and write the artifact."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import subprocess
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from medusa.artifact import save_artifact
from medusa.child import python_code
from medusa.engine.config import EngineConfig
from medusa.materialize.analysis import MaterializeError, RunView
from medusa.materialize.plan import build_plan
from medusa.materialize.weights import STORE, write_weights
from medusa.scratch import ScratchDir
from medusa.trace import read_trace, recorder_env

# Engine phases a restore skips (their work comes from the artifact instead).
ENGINE_SKIPPED = ("kv_profile", "graph_capture")
WORK = "medusa-mat-"  # the recordings, in /tmp
ROOM = 1 << 20  # bytes: less left free after a recording, and it ran out of space
SHIFT_BYTES = (2 << 20) + 4096  # held before the first allocation of the second run

ENGINE_SCRIPT = """
import json, sys
from medusa import plugins
from medusa.engine.config import EngineConfig
from medusa.engine.llm_engine import LLMEngine
from medusa.restore.compat import device_fingerprint
plugins.register()  # what the config may name (kv_memory="elastic")
e = LLMEngine(EngineConfig(**json.loads(sys.argv[1])), store=sys.argv[3] or None)
if e.store_error:
    sys.exit("the weight store was not used: " + e.store_error)
json.dump({
    "model": {"identity": e.source.identity(), "name": e.spec.name, "path": str(e.source.path)},
    "kv": {"num_blocks": e.runner.num_blocks, "block_bytes": e.runner.block_bytes,
           **e.runner.kv_cache.describe(), **e.kv_profile},
    "graphs": {"keys": sorted(e.runner.graphs, reverse=True)},
    "timings": e.timings, "device": device_fingerprint(e.device),
}, open(sys.argv[2], "w"))
"""

Echo = Callable[[str], None]


def _env(trace: Path, run: int, kind: str, extra: dict[str, str] | None = None) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if k not in ("MEDUSA_TRACE", "MEDUSA_MODE")}
    base.update(extra or {})
    env = recorder_env(trace, base=base)
    if kind == "sim":
        env["MEDUSA_SIM_SEED"] = str(1000 + run)  # a different arena base each run
    if run == 1:  # on simcuda too: the pad's footprint is part of what the recordings must survive
        env["MEDUSA_TRACE_SHIFT"] = str(SHIFT_BYTES)
    return env


def record_run(
    cmd: list[str],
    trace: Path,
    run: int,
    kind: str,
    echo: Echo,
    extra_env: dict[str, str] | None = None,
    what: str = "",
) -> float:
    t0 = time.perf_counter()
    env = _env(trace, run, kind, extra_env)
    res = subprocess.run(cmd, env=env, capture_output=True, text=True)
    _check_room(trace.parent)
    if res.returncode != 0:
        raise MaterializeError(
            f"the recorded start-up (run {run + 1}) exited {res.returncode}:\n{res.stderr[-3000:]}"
        )
    dt = time.perf_counter() - t0
    what = what or f"run {run + 1} of 2"
    echo(f"  recorded {what} in {dt:.1f} s ({trace.stat().st_size // 1024} KiB trace)")
    return dt


def _check_room(work: Path) -> None:
    """OSError(ENOSPC) naming the recordings' directory if it filled up while they ran (the
    recorder fails open: its trace, or the run's sidecar, would just end early)."""
    st = os.statvfs(work)
    free = st.f_bavail * st.f_frsize
    if free >= ROOM:
        return
    used = sum(p.stat().st_size for p in work.iterdir() if p.is_file())
    raise OSError(
        errno.ENOSPC,
        f"{work.parent}: no space left for the recordings ({used // 1024} KiB written when "
        f"it filled, {free // 1024} KiB free); free some space there, or set TMPDIR to a "
        "directory with more",
    )


def saved_images(a: RunView, plan: dict[str, Any]) -> dict[str, bytes]:
    images = {}
    for f in plan["funcs"]:
        data = a.trace.image(f["sha256"]) if f["sha256"] else None
        if data is not None:
            images[f["sha256"]] = data
    return images


def analyze_runs(
    ta: Path, tb: Path, skipped: set[str], echo: Echo
) -> tuple[RunView, RunView, dict, float]:
    t0 = time.perf_counter()
    a, b = RunView.build(read_trace(ta)), RunView.build(read_trace(tb))
    plan = build_plan(a, b, lambda phase: phase in skipped)
    dt = time.perf_counter() - t0
    echo(f"  analyzed {len(plan['graphs'])} graphs, {plan['num_nodes']} nodes in {dt:.2f} s")
    return a, b, plan, dt


def _device_of(run: RunView) -> dict[str, Any]:
    d = run.device
    if d is None:
        return {}
    return {
        "name": d.name,
        "total_mem": d.total_mem,
        "cc": list(d.cc),
        "driver_version": d.driver_version,
        "runtime_version": d.runtime_version,
        "sm_count": d.sm_count,
    }


def probe_kv(config: EngineConfig, work: Path, store: str, echo: Echo) -> dict[str, Any]:
    """The KV cache a plain start-up sizes (eager: the profiling pass is all it needs)."""
    t0 = time.perf_counter()
    cfg = {**asdict(config), "enforce_eager": True}
    env = {k: v for k, v in os.environ.items() if k not in ("MEDUSA_TRACE", "MEDUSA_MODE")}
    cmd = python_code(ENGINE_SCRIPT, json.dumps(cfg), str(work / "probe.json"), store)
    res = subprocess.run(cmd, env=env, capture_output=True, text=True)
    _check_room(work)
    if res.returncode != 0:
        raise MaterializeError(f"the plain start-up exited {res.returncode}:\n{res.stderr[-3000:]}")
    kv: dict[str, Any] = json.loads((work / "probe.json").read_text())["kv"]
    echo(f"  {kv['num_blocks']} KV blocks ({time.perf_counter() - t0:.1f} s)")
    return kv


def materialize_engine(
    config: EngineConfig,
    out: Path,
    kind: str,
    echo: Echo,
    *,
    weights: bool = True,
    check_accesses: str = "",
) -> dict[str, Any]:
    """weights: write the weight store first, and record start-ups that load from it.
    check_accesses: "warn" or "strict" (refuse on a disagreement) to cross-check the pointer
    classification against the accesses a third, instrumented run records (simcuda only)."""
    if check_accesses and kind != "sim":
        raise MaterializeError(
            "--check-accesses records kernels' accesses with simcuda's page protection; on a "
            "GPU that needs PTX instrumentation, which scripts/gpu does not run yet: drop it, "
            "or materialize on simcuda (MEDUSA_DEVICE=sim)"
        )
    out.parent.mkdir(parents=True, exist_ok=True)
    with (
        ScratchDir(WORK) as tmp,
        ScratchDir(f".{out.name}.weights.", out.parent) as near,
    ):  # NOTE: beside `out`, so the store moves into the artifact by a rename
        return _materialize_engine(
            config, out, kind, echo, tmp, near if weights else None, check_accesses
        )


def _materialize_engine(
    config: EngineConfig,
    out: Path,
    kind: str,
    echo: Echo,
    work: Path,
    near: Path | None,
    check_accesses: str,
) -> dict[str, Any]:
    timings: dict[str, float] = {}
    total = 4 + (near is not None) + (config.kv_cache_memory is None) + bool(check_accesses)
    steps = iter(range(1, total + 1))

    def step(what: str) -> None:
        echo(f"[{next(steps)}/{total}] {what}")

    store, section = "", None
    if near is not None:
        step("writing the weight store")
        t0 = time.perf_counter()
        section = write_weights(config.model, near / STORE, echo)
        store = str(near / STORE)
        timings["weights"] = time.perf_counter() - t0
    sidecars: list[dict[str, Any]] = []
    # NOTE: both recordings get the KV size of a plain start-up, as the vLLM path does. The
    # shift's pad holds device memory (2 MiB + 4 KiB takes 4 MiB pages), so a profiling pass
    # under it would size the cache differently; its real footprint is not ours to guess.
    kv: dict[str, Any] = {}
    if config.kv_cache_memory is None:
        step("starting the engine once, unrecorded, to learn its KV-cache size")
        t0 = time.perf_counter()
        kv = probe_kv(config, work, store, echo)
        timings["probe"] = time.perf_counter() - t0
    kv_bytes = config.kv_cache_memory or kv["num_blocks"] * kv["block_bytes"]
    for run in (0, 1):
        cfg = {**asdict(config), "kv_cache_memory": kv_bytes}
        cmd = python_code(ENGINE_SCRIPT, json.dumps(cfg), str(work / f"{run}.json"), store)
        step("recording the engine's start-up" + (" (shifted)" if run else ""))
        timings[f"record_{run + 1}"] = record_run(cmd, work / f"{run}.mtr", run, kind, echo)
        sidecars.append(json.loads((work / f"{run}.json").read_text()))
    blocks = [s["kv"]["num_blocks"] for s in sidecars]
    if blocks[0] != blocks[1]:
        raise MaterializeError(
            f"the two runs sized the KV cache differently ({blocks[0]} vs {blocks[1]} "
            "blocks): is another process using the device?"
        )
    step("analyzing")
    a, _, plan, timings["analyze"] = analyze_runs(
        work / "0.mtr", work / "1.mtr", set(ENGINE_SKIPPED), echo
    )
    if check_accesses:
        step("checking the pointer classification against recorded accesses")
        sized = EngineConfig(**{**asdict(config), "kv_cache_memory": kv_bytes})
        timings["check_accesses"] = check_pointer_accesses(
            sized, work, store, echo, strict=check_accesses == "strict"
        )
    side = sidecars[0]
    manifest = {
        "kind": "engine",
        "model": side["model"],
        "engine": asdict(config),
        "device": side["device"],
        "kv": {**side["kv"], **kv},
        "graphs": {
            "count": len(plan["graphs"]),
            "keys": side["graphs"]["keys"],
            "nodes": plan["num_nodes"],
            "templates": len(plan["templates"]),
        },
        "relocations": plan["relocations"],
        "baseline_startup": side["timings"],
        **({"weights": section} if section else {}),
    }
    label = f"[{next(steps)}/{total}]"
    store_path = Path(store) if store else None
    return write_artifact(
        out, manifest, plan, saved_images(a, plan), timings, echo, label, store_path
    )


def check_pointer_accesses(
    config: EngineConfig, work: Path, store: str, echo: Echo, *, strict: bool
) -> float:
    """Records run 0 again with kernels' accesses on (every graph replayed) and checks them
    against the two-run pointer classification of work/1.mtr: a word called a pointer must be
    dereferenced, a dereferenced word must be a pointer. Disagreements are warnings, or with
    `strict` a MaterializeError naming them. Returns the seconds it took."""
    from medusa.tessera.crosscheck import crosscheck
    from medusa.tessera.record import record_instrumented

    t0 = time.perf_counter()
    record_instrumented(config, work / "accesses.mtr", store, echo)
    check = crosscheck(
        RunView.build(read_trace(work / "accesses.mtr")), RunView.build(read_trace(work / "1.mtr"))
    )
    echo(
        f"  {check.nodes_checked} kernel nodes checked, {check.nodes_unknown} without recorded "
        f"accesses, {len(check.disagreements)} disagreements"
    )
    for d in check.disagreements:
        echo(f"  warning: {d}")
    if strict and check.disagreements:
        raise MaterializeError(
            f"--strict: the access analysis disagrees with the pointer classification on "
            f"{len(check.disagreements)} parameter(s), first: {check.disagreements[0]}; no "
            "artifact was written"
        )
    return time.perf_counter() - t0


def materialize_command(command: list[str], out: Path, kind: str, echo: Echo,
                        skipped: tuple[str, ...] = ()) -> dict[str, Any]:  # fmt: skip
    timings: dict[str, float] = {}
    with ScratchDir(WORK) as work:
        for run in (0, 1):
            echo(f"[{run + 1}/4] recording {' '.join(command)}" + (" (shifted)" if run else ""))
            timings[f"record_{run + 1}"] = record_run(command, work / f"{run}.mtr", run, kind, echo)
        echo("[3/4] analyzing")
        # An unmodified program marks no phases: nothing is skipped, every buffer is its own. A
        # program that restores through medusa.restore names the phases its restore skips.
        a, _, plan, timings["analyze"] = analyze_runs(
            work / "0.mtr", work / "1.mtr", set(skipped), echo
        )
        manifest = {
            "kind": "command",
            "model": {
                "identity": "command:" + hashlib.sha256(" ".join(command).encode()).hexdigest(),
                "name": " ".join(command),
            },
            "engine": {"command": command},
            "device": _device_of(a),
            "graphs": {
                "count": len(plan["graphs"]),
                "keys": list(range(len(plan["graphs"]))),
                "nodes": plan["num_nodes"],
                "templates": len(plan["templates"]),
            },
            "relocations": plan["relocations"],
        }
        return write_artifact(out, manifest, plan, saved_images(a, plan), timings, echo)


def write_artifact(
    out: Path,
    manifest: dict[str, Any],
    plan: dict[str, Any],
    images: dict[str, bytes],
    timings: dict[str, float],
    echo: Echo,
    label: str = "[4/4]",
    store: Path | None = None,
) -> dict[str, Any]:
    echo(f"{label} writing the artifact")
    t0 = time.perf_counter()
    manifest["kernels"] = {
        "count": len(plan["funcs"]),
        "exported": sum(1 for f in plan["funcs"] if f["symbol"]),
        "hidden": sum(1 for f in plan["funcs"] if not f["symbol"]),
        "images_saved": len(images),
    }
    manifest["materialize_seconds"] = timings
    save_artifact(out, manifest, plan, images, store=store)
    timings["write"] = time.perf_counter() - t0
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    return {"path": str(out), "bytes": size, "manifest": manifest, "timings": timings}
