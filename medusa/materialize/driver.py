"""`medusa materialize`: record a start-up twice (the second time with the address layout
shifted), analyze the two recordings and write the artifact. Any program's (`--command`) here;
the engine's (medusa.engine.materialize) and vLLM's (medusa.integrations.vllm.materialize) record
and describe their own start-ups through the same steps."""

from __future__ import annotations

import errno
import hashlib
import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from medusa.artifact import save_artifact
from medusa.materialize.analysis import MaterializeError
from medusa.materialize.plan import build_plan
from medusa.scratch import ScratchDir
from medusa.trace import read_trace, recorder_env
from medusa.trace.run_view import RunView

WORK = "medusa-mat-"  # the recordings, in /tmp
ROOM = 1 << 20  # bytes: less left free after a recording, and it ran out of space
SHIFT_BYTES = (2 << 20) + 4096  # held before the first allocation of the second run

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
    check_room(trace.parent)
    if res.returncode != 0:
        raise MaterializeError(
            f"the recorded start-up (run {run + 1}) exited {res.returncode}:\n{res.stderr[-3000:]}"
        )
    dt = time.perf_counter() - t0
    what = what or f"run {run + 1} of 2"
    echo(f"  recorded {what} in {dt:.1f} s ({trace.stat().st_size // 1024} KiB trace)")
    return dt


def run_group(
    cmds: list[list[str]], envs: list[dict[str, str]], logs: list[Path], what: str
) -> None:
    """Runs every rank of a tensor-parallel start-up at once (they meet in collectives), one
    process each, stderr to LOGS; the first to fail stops the others (they would wait for it
    until the collectives' timeout), and MaterializeError names it with its log's end."""
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for cmd, env, log in zip(cmds, envs, logs, strict=True):
            with log.open("wb") as err:
                procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=err))
        while any(p.poll() is None for p in procs):
            failed = [r for r, p in enumerate(procs) if p.returncode not in (None, 0)]
            if failed:
                break
            time.sleep(0.05)
        for r, p in enumerate(procs):
            if p.poll() not in (None, 0):
                tail = logs[r].read_text(errors="replace")[-3000:]
                raise MaterializeError(f"{what}: rank {r} exited {p.returncode}:\n{tail}")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()


def record_group(
    cmds: list[list[str]], traces: list[Path], run: int, kind: str, echo: Echo,
    extra_envs: list[dict[str, str]],
) -> float:  # fmt: skip
    """record_run for every rank of a tensor-parallel start-up, at once (run_group)."""
    t0 = time.perf_counter()
    envs = [_env(t, run, kind, extra) for t, extra in zip(traces, extra_envs, strict=True)]
    logs = [t.with_suffix(".log") for t in traces]
    run_group(cmds, envs, logs, f"the recorded start-up (run {run + 1})")
    check_room(traces[0].parent)
    dt = time.perf_counter() - t0
    size = sum(t.stat().st_size for t in traces) // 1024
    echo(f"  recorded run {run + 1} of 2, {len(cmds)} ranks, in {dt:.1f} s ({size} KiB traces)")
    return dt


def check_room(work: Path) -> None:
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
    ta: Path,
    tb: Path,
    skipped: set[str],
    echo: Echo,
    scale_by: tuple[str, int, int] | None = None,
) -> tuple[RunView, RunView, dict, float]:
    """(run a, run b, the plan, seconds); scale_by: see plan.build_plan."""
    t0 = time.perf_counter()
    a, b = RunView.build(read_trace(ta)), RunView.build(read_trace(tb))
    plan = build_plan(a, b, lambda phase: phase in skipped, scale_by)
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
    rank_stores: list[Path] | None = None,
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
    save_artifact(out, manifest, plan, images, store=store, rank_stores=rank_stores)
    timings["write"] = time.perf_counter() - t0
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    return {"path": str(out), "bytes": size, "manifest": manifest, "timings": timings}
