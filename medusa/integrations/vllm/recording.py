"""What `medusa materialize --engine vllm` adds to a vLLM start-up it records: the KV size vLLM
settled on and, after the capture, every graph under its descriptor, the device, the configuration
and which blocks the capture left live (held by Python, or by native code only), all written to
the sidecar file MEDUSA_VLLM_SIDECAR names."""

from __future__ import annotations

import functools
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from medusa import env
from medusa.integrations.vllm.capture import collect, count_captures, wrappers


def install_recording(worker_cls: Any, runner_cls: Any) -> None:
    """For `medusa materialize --engine vllm`: numbers captures and writes, to the sidecar, the KV
    size vLLM settled on and, after the capture, every graph under its descriptor."""
    import torch

    count_captures(torch.cuda.CUDAGraph)
    measure = worker_cls.determine_available_memory
    capture = runner_cls.capture_model
    if getattr(capture, "_medusa_records", False):
        return

    @functools.wraps(measure)
    def determine_available_memory(self: Any) -> int:
        kv = measure(self)
        data: dict[str, Any] = {"kv_cache_memory_bytes": int(kv)}
        if self.cache_config.kv_cache_memory_bytes is None:  # vLLM profiled (no size was set)
            data["kv_budget"] = kv_budget(self, int(kv))
        write_sidecar(data)
        return kv

    @functools.wraps(capture)
    def capture_model(self: Any, *, profile_only: bool = False) -> Any:
        before = set(live_blocks()) if not profile_only else set()
        out = capture(self, profile_only=profile_only)
        if not profile_only:
            created = sorted(set(live_blocks()) - before)
            held = python_held(created, python_storages())
            live = [
                [a, n, "python" if h else "native"] for (a, n), h in zip(created, held, strict=True)
            ]
            write_sidecar({**describe(self), "capture_live": live})
        return out

    capture_model._medusa_records = True  # type: ignore[attr-defined]
    worker_cls.determine_available_memory = determine_available_memory
    runner_cls.capture_model = capture_model


def kv_budget(worker: Any, kv: int) -> dict[str, int | float]:
    """What a profiling start-up measured besides the KV size. vLLM sizes the KV cache as
    `requested_memory - non_kv_cache_memory - cudagraph_memory_estimate` (gpu_worker.py), with
    requested_memory = total x --gpu-memory-utilization from init_device; so everything that is
    not KV cache (weights, the profiling forward's peak, non-torch memory, the graphs' estimate)
    is requested_memory - kv, which a restore on a device of another size subtracts from its own
    requested memory (kv_size.derived_kv_bytes) without a profiling forward."""
    requested = int(worker.requested_memory)
    snap = worker.init_snapshot
    return {
        "requested_memory": requested,
        "non_kv_bytes": requested - kv,
        "total_memory": int(snap.total_memory),
        "free_memory": int(snap.free_memory),
        "gpu_memory_utilization": float(worker.cache_config.gpu_memory_utilization),
    }


def live_blocks() -> list[tuple[int, int]]:
    """(address, size) of every block torch's caching allocator has handed to a live tensor."""
    import torch

    out = []
    for seg in torch.cuda.memory_snapshot(include_traces=False):
        addr = seg["address"]
        for blk in seg["blocks"]:
            if blk["state"] == "active_allocated":
                out.append((addr, blk["size"]))
            addr += blk["size"]
    return out


def python_storages(device_type: str = "cuda") -> list[tuple[int, int]]:
    """(address, bytes) of the storage of every tensor on device_type that a Python object can
    reach. A block torch handed out that none of these lies in is held by native code only, such
    as the cuBLAS/cuBLASLt workspaces below."""
    import gc
    import warnings

    import torch

    out = set()
    with warnings.catch_warnings():  # isinstance on deprecated module objects warns
        warnings.simplefilter("ignore")
        objs = [o for o in gc.get_objects() if isinstance(o, torch.Tensor)]
    for obj in objs:
        if obj.device.type == device_type:
            try:
                st = obj.untyped_storage()
            except (RuntimeError, NotImplementedError):  # e.g. a tensor without storage
                continue
            if st.nbytes():
                out.add((st.data_ptr(), st.nbytes()))
    return sorted(out)


def python_held(blocks: list[tuple[int, int]], storages: list[tuple[int, int]]) -> list[bool]:
    """For each (address, size) block, whether any Python-reachable storage overlaps it.

    Blocks torch's allocator gave out during the capture that no Python object holds are native
    buffers; the one every GEMM model has is PyTorch's cuBLAS/cuBLASLt workspace. PyTorch keys it
    by (handle, stream) -- `cublas_handle_stream_to_workspace()` and
    `cublaslt_handle_stream_to_workspace()` in aten/src/ATen/cuda/CublasHandlePool.cpp, filled by
    `setWorkspaceForHandle` / `getCUDABlasLtWorkspace` through
    `c10::cuda::CUDACachingAllocator::get()->allocate(size)` on the first GEMM on a stream. vLLM
    captures on a stream made inside capture_model, so that first GEMM is inside the capture and
    the workspace lands in the capture's memory, with graph nodes pointing into it. Nothing in a
    restored process recreates it for that stream (the stream is never made), so such a block is
    replayed with the capture-phase allocation like any graph-only memory."""
    return [any(a < addr + size and addr < a + n for a, n in storages) for addr, size in blocks]


def describe(runner: Any) -> dict[str, Any]:
    """Everything the artifact's vLLM section needs from a runner that has just captured."""
    import torch
    import vllm

    from medusa.integrations.vllm.schema import compile_cache_ref, config_fingerprint

    cfg = runner.vllm_config
    cache_dir = cfg.compilation_config.local_cache_dir
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    return {
        **collect(runner, wrappers()),
        "vllm_version": vllm.__version__,
        "config": config_fingerprint(cfg),
        "cudagraph_mode": cfg.compilation_config.cudagraph_mode.name,
        "kv_blocks": int(runner.kv_cache_config.num_blocks),
        "compile_cache": compile_cache_ref(cache_dir)
        if cache_dir
        else {"dir": None, "sha256": None, "files": 0},
        "device": {
            "name": props.name,
            "total_mem": props.total_memory,
            "cc": [props.major, props.minor],
        },
    }


def write_sidecar(data: dict[str, Any]) -> None:
    """Merges data into the sidecar file MEDUSA_VLLM_SIDECAR names (one per start-up)."""
    path = env.VLLM_SIDECAR.get()
    if not path:
        return
    p = Path(path.replace("%p", str(os.getpid())))
    old = {}
    try:  # NOTE: never through a link planted there (the directory may be /tmp)
        with os.fdopen(os.open(p, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)) as f:
            old = json.load(f)
    except FileNotFoundError:
        pass
    old.update(data)
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", dir=p.parent)  # O_EXCL|O_NOFOLLOW, 0600
    with os.fdopen(fd, "w") as f:
        json.dump(old, f)
    os.replace(tmp, p)
