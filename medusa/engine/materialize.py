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
    record_run,
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


def probe_kv(config: EngineConfig, work: Path, store: str, echo: Echo) -> dict[str, Any]:
    """The KV cache a plain start-up sizes (eager: the profiling pass is all it needs)."""
    t0 = time.perf_counter()
    cfg = {**asdict(config), "enforce_eager": True}
    env = {k: v for k, v in os.environ.items() if k not in ("MEDUSA_TRACE", "MEDUSA_MODE")}
    cmd = python_module(REPORT, json.dumps(cfg), str(work / "probe.json"), store)
    res = subprocess.run(cmd, env=env, capture_output=True, text=True)
    check_room(work)
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
    check: RecordingCheck | None = None,
) -> dict[str, Any]:
    """weights: write the weight store first, and record start-ups that load from it.
    check: run after the analysis, before the artifact is written."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with (
        ScratchDir(WORK) as tmp,
        ScratchDir(f".{out.name}.weights.", out.parent) as near,
    ):  # NOTE: beside `out`, so the store moves into the artifact by a rename
        return _Materialize(config, echo, tmp, check).run(out, kind, near if weights else None)


class _Materialize:
    """One materialization's steps, numbered as they are echoed ([2/5] ...)."""

    def __init__(
        self, config: EngineConfig, echo: Echo, work: Path, check: RecordingCheck | None
    ) -> None:
        self.config, self.echo, self.work, self.check = config, echo, work, check
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
        kv: dict[str, Any] = {}
        if config.kv_cache_memory is None:
            self.step("starting the engine once, unrecorded, to learn its KV-cache size")
            t0 = time.perf_counter()
            kv = probe_kv(config, work, store, self.echo)
            self.timings["probe"] = time.perf_counter() - t0
        sized = replace(config, kv_cache_memory=config.kv_cache_memory or
                        kv["num_blocks"] * kv["block_bytes"])  # fmt: skip
        side = self.record(sized, kind, store)
        self.step("analyzing")
        a, _, plan, self.timings["analyze"] = analyze_runs(
            work / "0.mtr", work / "1.mtr", set(ENGINE_SKIPPED), self.echo
        )
        if self.check is not None:
            self.step("checking the pointer classification against recorded accesses")
            self.timings["check_accesses"] = self.check(sized, work, store, self.echo)
        manifest = _manifest(config, side, kv, plan, section)
        label = f"[{self.done + 1}/{self.num_steps}]"
        store_path = Path(store) if store else None
        images = saved_images(a, plan)
        return write_artifact(out, manifest, plan, images, self.timings, self.echo, label,
                              store_path)  # fmt: skip

    def record(self, sized: EngineConfig, kind: str, store: str) -> dict[str, Any]:
        """Records the two start-ups; returns the first one's report."""
        reports: list[dict[str, Any]] = []
        for run in (0, 1):
            cmd = python_module(REPORT, json.dumps(asdict(sized)), str(self.work / f"{run}.json"),
                                store)  # fmt: skip
            self.step("recording the engine's start-up" + (" (shifted)" if run else ""))
            trace = self.work / f"{run}.mtr"
            self.timings[f"record_{run + 1}"] = record_run(cmd, trace, run, kind, self.echo)
            reports.append(json.loads((self.work / f"{run}.json").read_text()))
        blocks = [s["kv"]["num_blocks"] for s in reports]
        if blocks[0] != blocks[1]:
            raise MaterializeError(
                f"the two runs sized the KV cache differently ({blocks[0]} vs {blocks[1]} "
                "blocks): is another process using the device?"
            )
        return reports[0]


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
