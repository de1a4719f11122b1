"""`medusa materialize MODEL`: the engine's start-up recorded twice (the second time with the
address layout shifted) through medusa.materialize.driver, after its weights were written to a
weight store that both recordings load from. Each recording runs medusa.engine.startup_report."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from medusa.child import python_module
from medusa.engine.config import EngineConfig
from medusa.engine.materialize_ranks import (
    REPORT,
    probe_kv,
    rank_envs,
    rank_files,
    suffix,
    write_weights,
)
from medusa.materialize.analysis import MaterializeError
from medusa.materialize.driver import (
    WORK,
    Echo,
    analyze_runs,
    record_group,
    record_run,
    saved_images,
    write_artifact,
)
from medusa.scratch import ScratchDir

# Engine phases a restore skips (their work comes from the artifact instead).
ENGINE_SKIPPED = ("kv_profile", "graph_capture")

# An extra check of the recordings (Tessera's pointer check, `--check-accesses`): called with the
# configuration (its KV size fixed), the recordings' directory (1.mtr: the shifted run), the
# weight store ("" for none) and echo; returns the seconds it took, raises MaterializeError to
# refuse the artifact.
RecordingCheck = Callable[[EngineConfig, Path, str, Echo], float]


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
    every rank's plan and weight store (its shard)."""
    if ranks > 1 and check is not None:
        raise MaterializeError("a tensor-parallel artifact takes no access check")
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
        n = self.ranks
        stores, sections = [""] * n, [None] * n
        if near is not None:
            self.step("writing the weight store" + ("s, one per rank" if n > 1 else ""))
            t0 = time.perf_counter()
            for r in range(n):
                path, sections[r] = write_weights(config.model, near, self.echo,
                                                  (r, n) if n > 1 else None)  # fmt: skip
                stores[r] = str(path)
            self.timings["weights"] = time.perf_counter() - t0
        # NOTE: both recordings get the KV size of a plain start-up, as the vLLM path does. The
        # shift's pad holds device memory (2 MiB + 4 KiB takes 4 MiB pages), so a profiling pass
        # under it would size the cache differently; its real footprint is not ours to guess.
        kv: list[dict[str, Any]] = [{}] * n
        if config.kv_cache_memory is None:
            self.step("starting the engine once, unrecorded, to learn its KV-cache size")
            t0 = time.perf_counter()
            kv = probe_kv(config, work, stores, self.echo)
            self.timings["probe"] = time.perf_counter() - t0
        sized = [replace(config, kv_cache_memory=config.kv_cache_memory or
                         k["num_blocks"] * k["block_bytes"]) for k in kv]  # fmt: skip
        sides = self.record(sized, kind, stores)
        self.step("analyzing" + (f" {n} ranks" if n > 1 else ""))
        plans, images = [], {}
        for r in range(n):
            runs = [work / f"{run}{suffix(r, n)}.mtr" for run in (0, 1)]
            a, _, plan, dt = analyze_runs(*runs, set(ENGINE_SKIPPED), self.echo)
            self.timings["analyze"] = self.timings.get("analyze", 0.0) + dt
            plans.append(plan)
            images.update(saved_images(a, plan))
            del a
        if self.check is not None:
            self.step("checking the pointer classification against recorded accesses")
            self.timings["check_accesses"] = self.check(sized[0], work, stores[0], self.echo)
        manifest = _manifest(config, sides[0], kv[0], plans[0], sections[0])
        if n > 1:
            each = zip(sides, kv, plans, sections, strict=True)
            manifest["tensor_parallel"] = {"size": n, "ranks": [_rank_section(*x) for x in each]}
        plan = {**plans[0], "ranks": plans[1:]} if n > 1 else plans[0]
        label = f"[{self.done + 1}/{self.num_steps}]"
        paths = [Path(p) for p in stores if p]
        return write_artifact(out, manifest, plan, images, self.timings, self.echo, label,
                              paths[0] if paths else None, paths[1:])  # fmt: skip

    def record(
        self, sized: list[EngineConfig], kind: str, stores: list[str]
    ) -> list[dict[str, Any]]:
        """Records the two start-ups (every rank's, at once); returns the first one's reports,
        one per rank."""
        n, work = self.ranks, self.work
        reports: list[list[dict[str, Any]]] = []
        for run in (0, 1):
            self.step("recording the engine's start-up" + (" (shifted)" if run else ""))
            outs = [work / f"{run}{suffix(r, n)}.json" for r in range(n)]
            traces = [work / f"{run}{suffix(r, n)}.mtr" for r in range(n)]
            tp = [str(f) for f in rank_files(work, str(run), n)] if n > 1 else []
            cmds = [python_module(REPORT, json.dumps(asdict(c)), str(o), stores[r],
                                  *tp[r : r + 1])
                    for r, (c, o) in enumerate(zip(sized, outs, strict=True))]  # fmt: skip
            if n == 1:
                dt = record_run(cmds[0], traces[0], run, kind, self.echo)
            else:
                envs = rank_envs(n)
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


def _rank_section(
    side: dict[str, Any], kv: dict[str, Any], plan: dict[str, Any], weights: dict[str, Any] | None
) -> dict[str, Any]:
    """A rank's own part of the manifest (Artifact.for_rank puts it in place of rank 0's)."""
    m = _manifest(EngineConfig(), side, kv, plan, weights)
    return {k: m[k] for k in ("kv", "graphs", "relocations", "device", "weights") if k in m}


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
