"""`medusa materialize MODEL`: the engine's start-up recorded twice (the second time with the
address layout shifted) through medusa.materialize.driver, after its weights were written to a
weight store that both recordings load from. Each recording runs medusa.engine.startup_report."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from medusa.child import python_module
from medusa.engine.config import EngineConfig
from medusa.engine.loader import open_model
from medusa.engine.loader.stored import model_record
from medusa.materialize.analysis import MaterializeError
from medusa.materialize.driver import (
    WORK,
    Echo,
    analyze_runs,
    check_room,
    record_group,
    record_run,
    run_group,
    saved_images,
    write_artifact,
)
from medusa.scratch import ScratchDir
from medusa.weights import write_store

# Engine phases a restore skips (their work comes from the artifact instead).
ENGINE_SKIPPED = ("kv_profile", "graph_capture")
STORE = "weights.store"
REPORT = "medusa.engine.startup_report"

# An extra check of the recordings (Tessera's pointer check, `--check-accesses`): called with the
# configuration (its KV size fixed), the recordings' directory (1.mtr: the shifted run), the
# weight store ("" for none) and echo; returns the seconds it took, raises MaterializeError to
# refuse the artifact.
RecordingCheck = Callable[[EngineConfig, Path, str, Echo], float]


def write_weights(model: str | None, out: Path, echo: Echo) -> dict[str, Any]:
    """Writes MODEL's weight store to `out`: its weights as the loader hands them to the device
    (dequantized, fused, float32), so the recorded start-ups allocate as a restored start will.
    Returns the manifest's `weights` section."""
    t0 = time.perf_counter()
    src = open_model(model)
    shapes = list(src.spec.weight_shapes().items())
    marks = iter((0.25, 0.5, 0.75, 2.0))
    mark = next(marks)

    def progress(done: int, total: int) -> None:
        nonlocal mark
        if done >= mark * total:
            took = time.perf_counter() - t0
            echo(f"  {done / 2**20:.0f} of {total / 2**20:.0f} MiB ({took:.1f} s)")
            mark = next(marks)

    info = write_store(out, shapes, src.weights(), model_record(src), progress=progress)
    echo(
        f"  {info['tensors']} tensors, {info['data_bytes'] / 2**20:.0f} MiB in {info['chunks']} "
        f"chunks of {info['chunk_size'] >> 20} MiB ({info['hash']}) in "
        f"{time.perf_counter() - t0:.1f} s"
    )
    return {"file": STORE, **info}


def probe_kv(
    config: EngineConfig, work: Path, store: str, echo: Echo, ranks: int = 1
) -> list[dict[str, Any]]:
    """The KV cache a plain start-up sizes, per rank (eager: the profiling pass is all it
    needs)."""
    t0 = time.perf_counter()
    cfg = json.dumps({**asdict(config), "enforce_eager": True})
    env = {k: v for k, v in os.environ.items() if k not in ("MEDUSA_TRACE", "MEDUSA_MODE")}
    outs = [work / f"probe{_rank(r, ranks)}.json" for r in range(ranks)]
    if ranks == 1:
        res = subprocess.run(python_module(REPORT, cfg, str(outs[0]), store), env=env,
                             capture_output=True, text=True)  # fmt: skip
        check_room(work)
        if res.returncode != 0:
            raise MaterializeError(
                f"the plain start-up exited {res.returncode}:\n{res.stderr[-3000:]}"
            )
    else:
        tp = _rank_files(work, "probe", ranks)
        cmds = [
            python_module(REPORT, cfg, str(o), store, str(f)) for o, f in zip(outs, tp, strict=True)
        ]
        envs = [{**env, **d} for d in _rank_envs(ranks)]
        run_group(cmds, envs, [o.with_suffix(".log") for o in outs], "the plain start-up")
    kv = [json.loads(o.read_text())["kv"] for o in outs]
    echo(f"  {kv[0]['num_blocks']} KV blocks ({time.perf_counter() - t0:.1f} s)")
    return kv


def _rank(r: int, ranks: int) -> str:
    """A recording's file-name suffix: none on one device, .rR for rank R."""
    return "" if ranks == 1 else f".r{r}"


def _rank_envs(ranks: int) -> list[dict[str, str]]:
    """Each rank's process on a device of its own (medusa.engine.rank_devices)."""
    from medusa.cuda import load_backend
    from medusa.engine.rank_devices import rank_envs

    backend = load_backend()
    return rank_envs(ranks, backend.kind, os.environ, backend.device_count)


def _rank_files(work: Path, name: str, ranks: int) -> list[Path]:
    """Each rank's place in a new communicator (medusa.engine.startup_report's TP file), in
    the private work directory: its id is never on a command line."""
    from medusa.cuda import load_backend
    from medusa.cuda.nccl import Nccl

    uid = Nccl(load_backend()).unique_id().hex()
    files = [work / f"{name}.tp{r}.json" for r in range(ranks)]
    for r, f in enumerate(files):
        fd = os.open(f, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as out:
            json.dump({"rank": r, "size": ranks, "uid": uid}, out)
    return files


def materialize_engine(
    config: EngineConfig,
    out: Path,
    kind: str,
    echo: Echo,
    *,
    weights: bool = True,
    check: RecordingCheck | None = None,
    ranks: int = 1,
) -> dict[str, Any]:
    """weights: write the weight store first, and record start-ups that load from it.
    check: run after the analysis, before the artifact is written. ranks: a tensor-parallel
    group's size: every rank is recorded (at once, twice) and analyzed, and the artifact holds
    every rank's plan (each rank loads its shard from the model file: no weight store)."""
    if ranks > 1 and (weights or check is not None):
        raise MaterializeError(
            "a tensor-parallel artifact holds no weight store and takes no access check "
            "(--no-weights, no --check-accesses)"
        )
    out.parent.mkdir(parents=True, exist_ok=True)
    with (
        ScratchDir(WORK) as tmp,
        ScratchDir(f".{out.name}.weights.", out.parent) as near,
    ):  # NOTE: beside `out`, so the store moves into the artifact by a rename
        m = _Materialize(config, echo, tmp, check, ranks)
        return m.run(out, kind, near if weights else None)


class _Materialize:
    """One materialization's steps, numbered as they are echoed ([2/5] ...)."""

    def __init__(
        self, config: EngineConfig, echo: Echo, work: Path, check: RecordingCheck | None,
        ranks: int,
    ) -> None:  # fmt: skip
        self.config, self.echo, self.work, self.check = config, echo, work, check
        self.ranks = ranks
        self.timings: dict[str, float] = {}
        self.num_steps, self.done = 0, 0

    def step(self, what: str) -> None:
        self.done += 1
        self.echo(f"[{self.done}/{self.num_steps}] {what}")

    def run(self, out: Path, kind: str, near: Path | None) -> dict[str, Any]:
        config, work = self.config, self.work
        self.num_steps = (4 + (near is not None) + (config.kv_cache_memory is None)
                          + (self.check is not None))  # fmt: skip
        store, section = "", None
        if near is not None:
            self.step("writing the weight store")
            t0 = time.perf_counter()
            section = write_weights(config.model, near / STORE, self.echo)
            store = str(near / STORE)
            self.timings["weights"] = time.perf_counter() - t0
        # NOTE: both recordings get the KV size of a plain start-up, as the vLLM path does. The
        # shift's pad holds device memory (2 MiB + 4 KiB takes 4 MiB pages), so a profiling pass
        # under it would size the cache differently; its real footprint is not ours to guess.
        n = self.ranks
        kv: list[dict[str, Any]] = [{}] * n
        if config.kv_cache_memory is None:
            self.step("starting the engine once, unrecorded, to learn its KV-cache size")
            t0 = time.perf_counter()
            kv = probe_kv(config, work, store, self.echo, n)
            self.timings["probe"] = time.perf_counter() - t0
        sized = [replace(config, kv_cache_memory=config.kv_cache_memory or
                         k["num_blocks"] * k["block_bytes"]) for k in kv]  # fmt: skip
        sides = self.record(sized, kind, store)
        self.step("analyzing" + (f" {n} ranks" if n > 1 else ""))
        plans, images = [], {}
        for r in range(n):
            runs = [work / f"{run}{_rank(r, n)}.mtr" for run in (0, 1)]
            a, _, plan, dt = analyze_runs(*runs, set(ENGINE_SKIPPED), self.echo)
            self.timings["analyze"] = self.timings.get("analyze", 0.0) + dt
            plans.append(plan)
            images.update(saved_images(a, plan))
            del a
        if self.check is not None:
            self.step("checking the pointer classification against recorded accesses")
            self.timings["check_accesses"] = self.check(sized[0], work, store, self.echo)
        manifest = _manifest(config, sides[0], kv[0], plans[0], section)
        if n > 1:
            each = zip(sides, kv, plans, strict=True)
            manifest["tensor_parallel"] = {"size": n, "ranks": [_rank_section(*x) for x in each]}
        plan = {**plans[0], "ranks": plans[1:]} if n > 1 else plans[0]
        label = f"[{self.done + 1}/{self.num_steps}]"
        store_path = Path(store) if store else None
        return write_artifact(out, manifest, plan, images, self.timings, self.echo, label,
                              store_path)  # fmt: skip

    def record(self, sized: list[EngineConfig], kind: str, store: str) -> list[dict[str, Any]]:
        """Records the two start-ups (every rank's, at once); returns the first one's reports,
        one per rank."""
        n, work = self.ranks, self.work
        reports: list[list[dict[str, Any]]] = []
        for run in (0, 1):
            self.step("recording the engine's start-up" + (" (shifted)" if run else ""))
            outs = [work / f"{run}{_rank(r, n)}.json" for r in range(n)]
            traces = [work / f"{run}{_rank(r, n)}.mtr" for r in range(n)]
            tp = [str(f) for f in _rank_files(work, str(run), n)] if n > 1 else []
            cmds = [python_module(REPORT, json.dumps(asdict(c)), str(o), store, *tp[r : r + 1])
                    for r, (c, o) in enumerate(zip(sized, outs, strict=True))]  # fmt: skip
            if n == 1:
                dt = record_run(cmds[0], traces[0], run, kind, self.echo)
            else:
                envs = _rank_envs(n)
                dt = record_group(cmds, traces, run, kind, self.echo, envs)
            self.timings[f"record_{run + 1}"] = dt
            reports.append([json.loads(o.read_text()) for o in outs])
        blocks = [s[0]["kv"]["num_blocks"] for s in reports]
        if blocks[0] != blocks[1]:
            raise MaterializeError(
                f"the two runs sized the KV cache differently ({blocks[0]} vs {blocks[1]} "
                "blocks): is another process using the device?"
            )
        return reports[0]


def _rank_section(side: dict[str, Any], kv: dict[str, Any], plan: dict[str, Any]) -> dict[str, Any]:
    """A rank's own part of the manifest (Artifact.for_rank puts it in place of rank 0's)."""
    m = _manifest(EngineConfig(), side, kv, plan, None)
    return {k: m[k] for k in ("kv", "graphs", "relocations", "device")}


def _manifest(
    config: EngineConfig,
    side: dict[str, Any],
    kv: dict[str, Any],
    plan: dict[str, Any],
    section: dict[str, Any] | None,
) -> dict[str, Any]:
    return {
        "kind": "engine",
        "model": side["model"],
        "engine": asdict(config),
        "device": side["device"],
        "kv": {**side["kv"], **kv},
        "graphs": {
            "count": len(plan["graphs"]),
            "keys": side["graphs"]["keys"],
            "prefill_keys": side["graphs"]["prefill_keys"],
            "nodes": plan["num_nodes"],
            "templates": len(plan["templates"]),
        },
        "relocations": plan["relocations"],
        "baseline_startup": side["timings"],
        **({"weights": section} if section else {}),
    }
