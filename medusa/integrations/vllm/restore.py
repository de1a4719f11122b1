"""Restoring a vLLM start-up from an artifact, inside vLLM's own worker process.

- KV size: before the worker measures memory, cache_config.kv_cache_memory_bytes is set from the
  artifact (after checking free memory), so vLLM skips the measurement and the profiling capture.
- Graphs: GPUModelRunner.capture_model builds the recorded graphs instead of capturing: the
  Restorer maps this start-up's allocations onto the recorded ones, replays the capture phase's
  allocations that graphs use, resolves kernels and instantiates every graph. FULL graphs go into
  the CudaGraphManager as objects whose replay() launches the restored executable on the current
  stream; PIECEWISE graphs become entries of the numbered static graph wrappers, their outputs
  tensors over the restored memory.
- Before building, capture_model's own preparation runs (PREPARATION: the collector frozen, torch's
  cached blocks released), so the replayed allocations do not compete with warm-up memory.
- Anything that goes wrong (another vLLM, config, device, compile cache, a start-up that allocated
  differently, but also a CUDA error, a missing driver entry point or library) makes capture_model
  undo what it did, log the reason and capture the normal way; MEDUSA_REQUIRE_ARTIFACT=1 makes it
  an error instead.

NOTE: this runs only on a GPU; scripts/gpu/vllm_coldstart.sh exercises it end to end.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import time
from collections.abc import Iterator
from typing import Any

from medusa import env
from medusa.artifact import Artifact, ArtifactError
from medusa.cuda.backend import load_backend
from medusa.integrations.vllm import capture as cap
from medusa.integrations.vllm.descriptors import descriptor_from_key
from medusa.integrations.vllm.kv_size import open_artifact, reason
from medusa.integrations.vllm.restored import RestoredGraph, build_output
from medusa.integrations.vllm.schema import (
    check_section,
    compile_cache_ref,
    config_fingerprint,
)
from medusa.restore.errors import RestoreError
from medusa.restore.restorer import Restorer

log = logging.getLogger("medusa.vllm")


def _check_runner(runner: Any) -> None:
    """Refuses what the restore does not rebuild (it would otherwise be silently missing)."""
    if runner.cudagraph_manager is None:
        raise RestoreError("the runner has no CUDA graph manager (cudagraph_mode NONE?)")
    from vllm.v1.worker.gpu.model_states.interface import ModelState

    extra = {
        "a speculator": getattr(runner, "speculator", None) is not None,
        "adaptive verification": getattr(runner, "adaptive_verification", None) is not None,
        "prefill context parallelism": getattr(runner, "pcp_manager", None) is not None,
        "LoRA": getattr(runner, "lora_config", None) is not None,
        "microbatching": getattr(runner.cudagraph_manager, "ubatch_runner", None) is not None,
        "encoder graphs": bool(getattr(runner.model_state, "supports_mm_inputs", False)),
        "inner model graphs": type(runner.model_state).capture_inner_cudagraphs
        is not ModelState.capture_inner_cudagraphs,
        "breakable graphs": bool(getattr(runner.cudagraph_manager, "use_breakable_cg", False)),
    }
    used = [k for k, v in extra.items() if v]
    if used:
        raise RestoreError(f"restore does not cover {', '.join(used)} yet")


def restore_into(runner: Any, artifact: str) -> int:
    """Builds the artifact's graphs into runner (a V2 GPUModelRunner); returns the bytes the
    restored graphs hold, as capture_model does."""
    t0 = time.perf_counter()
    art = _open_checked(artifact)
    section = art.manifest["vllm"]
    _check_config(runner, section)
    _check_device(art.manifest.get("device", {}))
    _check_runner(runner)
    wrappers = cap.wrappers()
    if [cap.wrapper_identity(w) for w in wrappers] != section["wrappers"]:
        raise RestoreError(
            f"this start-up built {len(wrappers)} piecewise graph wrappers, the recorded one "
            f"{len(section['wrappers'])} (or in another order): the compiled model differs"
        )

    kv = runner.vllm_config.cache_config.kv_cache_memory_bytes
    if kv != section["kv_cache_memory_bytes"] and "scale" not in art.plan:
        raise RestoreError(
            f"this start-up sized the KV cache at {kv} bytes, the recorded one at "
            f"{section['kv_cache_memory_bytes']} (a device of another size), and the artifact was "
            "recorded at one KV size (materialize could not join two): vLLM's graphs hold "
            "addresses inside the KV cache that depend on its size, so they are captured anew "
            "(the profiling forward is still skipped)"
        )
    return _build(runner, art, wrappers, t0)


def _open_checked(artifact: str) -> Artifact:
    """The artifact, with a vLLM section this vLLM can restore."""
    import vllm

    try:
        art = open_artifact(artifact)
    except (ArtifactError, OSError) as e:
        raise RestoreError(str(e)) from e
    try:
        check_section(art.manifest["vllm"], vllm_version=vllm.__version__)
    except ValueError as e:
        raise RestoreError(str(e)) from e
    return art


def _check_config(runner: Any, section: dict[str, Any]) -> None:
    """This start-up's vLLM settings and torch.compile cache are the recorded ones."""
    live = config_fingerprint(runner.vllm_config)
    for k, want in section["config"].items():
        if live.get(k) != want:
            raise RestoreError(
                f"vLLM configuration mismatch: {k}={live.get(k)!r} here, {want!r} when "
                "materialized; use the same settings or materialize again"
            )
    cache_dir = runner.vllm_config.compilation_config.local_cache_dir
    want_cache = section["compile_cache"]
    if want_cache["files"]:
        got = compile_cache_ref(cache_dir) if cache_dir else {"sha256": None, "dir": None}
        if got["sha256"] != want_cache["sha256"]:
            raise RestoreError(
                f"the torch.compile cache {got['dir']} is not the one the graphs were recorded "
                f"with ({want_cache['dir']}): its kernels may differ; materialize again"
            )


def _check_device(dev: dict[str, Any]) -> None:
    import torch

    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    if dev.get("name") != props.name or dev.get("total_mem") != props.total_memory:
        raise RestoreError(
            f"device mismatch: this is a {props.name} with {props.total_memory} bytes, the "
            f"artifact is for a {dev.get('name')} with {dev.get('total_mem')}"
        )


def _build(runner: Any, art: Artifact, wrappers: list[Any], t0: float) -> int:
    """Restores the graphs into runner; on any failure undoes what it did before it re-raises."""
    import torch
    from vllm.v1.worker.workspace import lock_workspace

    section, mgr = art.manifest["vllm"], runner.cudagraph_manager
    restorer: Restorer | None = None
    done = False
    try:
        # the graphs' pointers into the KV cache follow this start-up's block count (scaled.py)
        count = int(runner.kv_cache_config.num_blocks) if "scale" in art.plan else None
        restorer = Restorer(art, load_backend("cuda"), count=count)
        result = restorer.restore(torch.cuda.current_stream().cuda_stream)
        _install_graphs(section, mgr, wrappers, result.execs, restorer)
        plan = art.plan
        held = sum(a[3] for a in plan["allocs"] if a[0] in plan["skipped_phases"] and not a[4])
        # Last: a normal capture after an undo must still find the workspace unlocked.
        lock_workspace()  # as capture_model does: a resize would free what the graphs point at
        done = True
    finally:
        if not done:  # whatever stopped the restore, vLLM must find the runner as it was
            _undo(mgr, wrappers, restorer)
    log.info(
        "medusa: restored %d vLLM graphs (%d nodes) in %.3f s, %.2f GiB; kernels: %s",
        len(section["graphs"]),
        art.plan["num_nodes"],
        time.perf_counter() - t0,
        held / 2**30,
        dict(result.methods),
    )
    return held


def _install_graphs(
    section: dict[str, Any], mgr: Any, wrappers: list[Any], execs: list[int], restorer: Restorer
) -> None:
    """FULL graphs into the graph manager, PIECEWISE ones into their wrappers, and the manager's
    output tensors over the restored memory."""
    import torch
    from vllm.compilation.cuda_graph import CUDAGraphEntry
    from vllm.config.compilation import CUDAGraphMode
    from vllm.forward_context import BatchDescriptor
    from vllm.v1.worker.gpu.cudagraph_utils import BatchExecutionDescriptor

    base = restorer.bases[0]
    device = torch.device("cuda", torch.cuda.current_device())
    enums = {"CUDAGraphMode": CUDAGraphMode}
    for g in section["graphs"]:
        graph = RestoredGraph(execs[g["graph"]], restorer.b)
        if g["kind"] == "full":
            mgr.graphs[descriptor_from_key(BatchExecutionDescriptor, g["key"], enums)] = graph
        else:
            bd = descriptor_from_key(BatchDescriptor, g["key"], enums)
            wrappers[g["wrapper"]].concrete_cudagraph_entries[bd] = CUDAGraphEntry(
                batch_descriptor=bd,
                cudagraph=graph,
                output=build_output(g["output"], base, device),
            )
    outs = section["outputs"]
    mgr.hidden_states = build_output(outs["hidden_states"], base, device)
    mgr.aux_hidden_states = build_output(outs["aux_hidden_states"], base, device) or []
    mgr.intermediate_tensors = build_output(outs["intermediate_tensors"], base, device)
    mgr._graphs_captured = True


def _undo(mgr: Any, wrappers: list[Any], restorer: Restorer | None) -> None:
    mgr.graphs.clear()
    mgr._graphs_captured = False
    for w in wrappers:
        w.concrete_cudagraph_entries.clear()
    mgr.hidden_states, mgr.aux_hidden_states, mgr.intermediate_tensors = None, [], None
    if restorer is not None:
        restorer.release()


@contextlib.contextmanager
def capture_preparation() -> Iterator[None]:
    """What GPUModelRunner.capture_model does before it captures (points.PREPARATION, checked
    against vLLM's own): inference mode, the collector frozen, then torch's cached blocks
    released, so that the replayed allocations do not compete with the warm-up's cached memory."""
    import torch
    from vllm.utils.gc_utils import freeze_gc_for_cudagraph_capture

    with torch.inference_mode(), freeze_gc_for_cudagraph_capture():
        torch.accelerator.empty_cache()
        yield


def install_restore(runner_cls: Any, artifact: str) -> None:
    """capture_model restores instead of capturing; on any mismatch it captures as usual."""
    fn = runner_cls.capture_model
    if getattr(fn, "_medusa_restore", False):
        return

    tried: list[bool] = []

    @functools.wraps(fn)
    def capture_model(self: Any, *, profile_only: bool = False) -> int:
        if profile_only or tried:  # profiling, or a re-capture (elastic EP): vLLM's own
            return int(fn(self, profile_only=profile_only))
        tried.append(True)
        try:
            with capture_preparation():
                return restore_into(self, artifact)
        # NOTE: every exception, not only RestoreError: a CUDA error (RuntimeError), a driver
        # without an entry point (AttributeError) or a missing library (OSError) must not end
        # vLLM's start-up when the normal capture would do. Interrupts still propagate.
        except Exception as e:
            if env.REQUIRE_ARTIFACT.get():
                raise
            log.warning(
                "medusa: restore failed, capturing CUDA graphs the normal way: %s", reason(e)
            )
        return int(fn(self, profile_only=False))

    capture_model._medusa_restore = True  # type: ignore[attr-defined]
    runner_cls.capture_model = capture_model
