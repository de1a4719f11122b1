"""`medusa materialize --engine vllm MODEL -- [vLLM args]`: learn vLLM's KV size, record its
start-up twice (the second time shifted, with a KV cache 1/16 smaller), and write a vLLM artifact
whose graphs restore onto a KV cache of any size.

Three start-ups, one after another, each in its own process:
1. a plain one (not recorded): vLLM profiles memory and settles on the KV-cache size; it also
   fills the torch.compile cache, so the recorded runs and every restore load the same kernels.
   It first resolves, as `vllm serve` would on this machine, the settings whose defaults differ
   between vllm.LLM and `vllm serve` (startup.SERVE_DEFAULTS), and starts with them pinned;
2. and 3. recorded with those settings and `--kv-cache-memory-bytes` set (which is how a restore
   starts too: the plugin sets the size it derives for its device), the second with fewer KV
   blocks. Pointers into the KV cache whose offset follows its block count (vLLM's value cache
   after num_blocks key blocks) are kept with their slope (materialize.analysis.Scale). Where the
   two sizes cannot be joined (a kernel given a size-dependent scalar), the second run is recorded
   again at the first's size, and the artifact restores onto a KV cache of that size only. Each
   process records into its own trace; the engine core's is picked by content (traces.py).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from medusa.child import python_module
from medusa.integrations.vllm.analysis import graph_section
from medusa.integrations.vllm.phases import SKIPPED
from medusa.integrations.vllm.schema import vllm_section
from medusa.integrations.vllm.traces import engine_core_trace, process_traces, trace_pattern
from medusa.materialize.analysis import MaterializeError
from medusa.materialize.driver import SHIFT_BYTES, Echo, analyze_runs, saved_images, write_artifact
from medusa.trace import recorder_env
from medusa.trace.control import remove_trace


def startup_command(
    result: Path, argv: list[str], *, bench: bool = False, resolve: bool = False
) -> list[str]:
    cmd = python_module("medusa.integrations.vllm.startup", "--out", str(result))
    flags = (["--bench"] if bench else []) + (["--resolve"] if resolve else [])
    return cmd + flags + ["--", *argv]


def _run(cmd: list[str], env: dict[str, str], what: str, echo: Echo) -> float:
    t0 = time.perf_counter()
    res = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if res.returncode != 0:
        raise MaterializeError(f"{what} exited {res.returncode}:\n{res.stderr[-3000:]}")
    dt = time.perf_counter() - t0
    echo(f"  {what} took {dt:.1f} s")
    return dt


# vLLM's flag for the KV size (EngineArgs.kv_cache_memory_bytes). `--kv-cache-memory`, which
# vLLM's own messages suggest, parses only as an abbreviation of it; both are stripped.
KV_FLAG = "--kv-cache-memory-bytes"
KV_FLAGS = (KV_FLAG, "--kv-cache-memory")


def strip_kv_size(argv: list[str]) -> list[str]:
    """argv without a KV-size setting."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a in KV_FLAGS:
            skip = True
        elif not a.startswith(tuple(f + "=" for f in KV_FLAGS)):
            out.append(a)
    return out


def with_kv_size(argv: list[str], kv_bytes: int) -> list[str]:
    """argv with the KV size set to kv_bytes (replacing one the user gave)."""
    return [*strip_kv_size(argv), KV_FLAG, str(kv_bytes)]


def materialize_vllm(argv: list[str], out: Path, kind: str, echo: Echo) -> dict[str, Any]:
    _check_request(argv, kind)
    timings: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="medusa-vllm-") as tmp:
        work = Path(tmp)
        base = {k: v for k, v in os.environ.items() if not k.startswith("MEDUSA_")}
        probe, kv = _probe(work, argv, base, echo, timings)
        recorded = with_kv_size(probe["argv"], kv)  # with vllm serve's defaults pinned
        sides = [_record(work, 0, recorded, base, echo, timings)]
        if "graphs" not in sides[0]:
            raise MaterializeError(
                "vLLM captured no graphs through the V2 model runner (enforce_eager, "
                "cudagraph_mode NONE, or VLLM_USE_V2_MODEL_RUNNER=0?): nothing to materialize"
            )
        smaller = with_kv_size(probe["argv"], kv - kv // 16)
        sides.append(_record(work, 1, smaller, base, echo, timings))
        try:
            a, b, plan, joined = _analyze(work, sides, echo, timings, scaled=True)
        except MaterializeError as e:
            echo(f"  the KV size cannot follow the device ({e}); recording again at one size")
            sides[1] = _record(work, 1, recorded, base, echo, timings)
            a, b, plan, joined = _analyze(work, sides, echo, timings, scaled=False)
        manifest = _manifest(argv[0], recorded, kv, probe, sides[0], joined, plan)
        return write_artifact(out, manifest, plan, saved_images(a, plan), timings, echo)


def _check_request(argv: list[str], kind: str) -> None:
    if kind != "cuda":
        raise MaterializeError(
            "materializing vLLM needs an NVIDIA GPU (vLLM does not run on simcuda); run it on "
            "the machine type that will serve the model"
        )
    if not argv or argv[0].startswith("-"):
        raise MaterializeError("name the model: medusa materialize --engine vllm MODEL -- [ARGS]")


def _probe(
    work: Path, argv: list[str], base: dict[str, str], echo: Echo, timings: dict[str, float]
) -> tuple[dict[str, Any], int]:
    """Start-up 1, not recorded: (its result, the KV-cache bytes vLLM settled on)."""
    echo("[1/5] starting vLLM once to learn its KV-cache size (and fill its compile cache)")
    probe_env = {**base, "MEDUSA_VLLM_SIDECAR": str(work / "probe.side.json")}
    timings["probe"] = _run(
        startup_command(work / "probe.json", argv, resolve=True),
        probe_env,
        "the plain start-up",
        echo,
    )
    probe_side = json.loads((work / "probe.side.json").read_text())
    probe = json.loads((work / "probe.json").read_text())
    kv = int(probe_side["kv_cache_memory_bytes"])
    if "kv_budget" not in probe_side:
        raise MaterializeError(
            "the plain start-up did not profile memory (a KV size was given, or vLLM's "
            "VLLM_ENABLE_STARTUP_PLAN applied a saved one): unset it so that the artifact "
            "records what profiling measured"
        )
    probe["kv_budget"] = probe_side["kv_budget"]
    echo(
        f"  KV cache: {kv / 2**30:.2f} GiB of {probe['kv_budget']['requested_memory'] / 2**30:.2f}"
        f" GiB requested; vLLM start-up {probe['startup_seconds']:.1f} s"
    )
    return probe, kv


def _record(
    work: Path,
    run: int,
    argv: list[str],
    base: dict[str, str],
    echo: Echo,
    timings: dict[str, float],
) -> dict[str, Any]:
    """Start-up 2 or 3 (run 0 or 1), recorded, the second shifted: its sidecar."""
    for old in work.glob(f"{run}-*.mtr"):  # a run recorded again: its traces and side files
        remove_trace(old)
    for old in work.glob(f"{run}.*"):
        old.unlink()
    env = recorder_env(trace_pattern(work, str(run)), base=base)
    env["MEDUSA_VLLM_SIDECAR"] = str(work / f"{run}.side.json")
    if run == 1:
        env["MEDUSA_TRACE_SHIFT"] = str(SHIFT_BYTES)
    echo(f"[{run + 2}/5] recording the start-up" + (" (shifted)" if run else ""))
    timings[f"record_{run + 1}"] = _run(
        startup_command(work / f"{run}.json", argv), env, f"recorded run {run + 1}", echo
    )
    return json.loads((work / f"{run}.side.json").read_text())  # type: ignore[no-any-return]


def _analyze(
    work: Path, sides: list[dict[str, Any]], echo: Echo, timings: dict[str, float], *, scaled: bool
) -> tuple[Any, Any, dict[str, Any], dict[str, Any]]:
    """(run a, run b, plan, graph section) of the two recorded runs; scaled: the runs differ in
    their KV blocks, which the kv_alloc phase's allocations are sized by."""
    echo("[4/5] analyzing")
    ta, tb = (engine_core_trace(process_traces(work, str(run))) for run in (0, 1))
    blocks = ("kv_alloc", int(sides[0]["kv_blocks"]), int(sides[1]["kv_blocks"]))
    a, b, plan, timings["analyze"] = analyze_runs(
        ta, tb, set(SKIPPED), echo, blocks if scaled else None
    )
    joined = graph_section(a, b, sides[0], sides[1], lambda phase: phase in SKIPPED, plan)
    return a, b, plan, joined


def _manifest(
    model: str,
    recorded: list[str],
    kv: int,
    probe: dict[str, Any],
    side: dict[str, Any],
    joined: dict[str, Any],
    plan: dict[str, Any],
) -> dict[str, Any]:
    section = vllm_section(
        version=side["vllm_version"],
        kv_cache_memory_bytes=kv,
        kv_budget=probe["kv_budget"],
        cudagraph_mode=side["cudagraph_mode"],
        graphs=joined["graphs"],
        compile_cache=side["compile_cache"],
        config=side["config"],
        outputs=joined["outputs"],
        wrappers=joined["wrappers"],
    )
    return {
        "kind": "vllm",
        "model": {
            "identity": "vllm:" + hashlib.sha256(json.dumps(side["config"]).encode()).hexdigest(),
            "name": model,
        },
        "engine": {"name": "vllm", "argv": recorded},
        "device": side["device"],
        "vllm": section,
        "graphs": {
            "count": len(plan["graphs"]),
            "keys": [g["key"]["fields"].get("num_tokens") for g in joined["graphs"]],
            "nodes": plan["num_nodes"],
            "templates": len(plan["templates"]),
        },
        "relocations": plan["relocations"],
        "baseline_startup": {"seconds": probe["startup_seconds"], **probe["phase_seconds"]},
    }
