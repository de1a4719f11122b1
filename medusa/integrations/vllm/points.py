"""The points where the plugin attaches to vLLM, checked before anything is patched.

Each check reads the installed vLLM (classes, methods, signatures, dataclass fields, and the few
lines of source the restore must mirror) and says what differs; the plugin refuses a vLLM with
any difference instead of patching it half-way. Checked against vLLM 0.32.0 and 0.33.0.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import textwrap
from collections.abc import Callable
from typing import Any

TESTED = ("0.32.", "0.33.")

# What GPUModelRunner.capture_model does before it captures, in order: the restore does the same
# (restore.capture_preparation), so replayed allocations meet the memory a capture would.
PREPARATION = ("freeze_gc_for_cudagraph_capture", "torch.accelerator.empty_cache")


def _get(path: str) -> Any:
    module, _, name = path.partition(":")
    obj: Any = importlib.import_module(module)
    for part in name.split(".") if name else []:
        obj = getattr(obj, part)
    return obj


def _params(fn: Any) -> list[str]:
    """Parameter names as a call sees them: `*` before the keyword-only ones."""
    out: list[str] = []
    for p in inspect.signature(fn).parameters.values():
        if p.kind is p.KEYWORD_ONLY and not any(x.startswith("*") for x in out):
            out.append("*")
        stars = "*" if p.kind is p.VAR_POSITIONAL else "**" if p.kind is p.VAR_KEYWORD else ""
        out.append(stars + p.name)
    return out


def _fields(cls: type) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return node.id if isinstance(node, ast.Name) else "?"


def preparation(capture_model: Any) -> tuple[str, ...]:
    """What capture_model runs before its first `with self.maybe_setup_dummy_loras` / capture:
    the context managers it enters and the calls it makes, as dotted names."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(capture_model)))
    body = tree.body[0].body  # type: ignore[attr-defined]
    for stmt in body:
        if isinstance(stmt, ast.With):
            names = [_dotted(i.context_expr.func) for i in stmt.items]  # type: ignore[attr-defined]
            calls = []
            for inner in stmt.body:
                if not (isinstance(inner, ast.Expr) and isinstance(inner.value, ast.Call)):
                    break
                calls.append(_dotted(inner.value.func))
            return (*names, *calls)
    return ()


def _runner_checks() -> list[tuple[str, Callable[[], bool]]]:
    runner = "vllm.v1.worker.gpu.model_runner:GPUModelRunner"
    cg = "vllm.v1.worker.gpu.cudagraph_utils"
    return [
        (f"{runner}.capture_model(self, *, profile_only)",
         lambda: _params(_get(runner).capture_model) == ["self", "*", "profile_only"]),
        (f"{runner}.capture_model prepares with {' then '.join(PREPARATION)}",
         lambda: preparation(_get(runner).capture_model) == PREPARATION),
        (f"{runner}.capture_model ends with lock_workspace()",
         lambda: "lock_workspace()" in inspect.getsource(_get(runner).capture_model)),
        (f"{cg}:BatchExecutionDescriptor fields",
         lambda: _fields(_get(f"{cg}:BatchExecutionDescriptor")) == {
             "cg_mode", "num_tokens", "num_reqs", "uniform_token_count", "max_query_len",
             "num_active_loras", "num_ubatches"}),
        (f"{cg}:CudaGraphManager keeps graphs[desc] and replays them",
         lambda: all(f"self.{a}" in inspect.getsource(_get(f"{cg}:CudaGraphManager"))
                     for a in ("graphs", "_graphs_captured", "graphs[desc].replay()"))),
        (f"{cg}:ModelCudaGraphManager outputs",
         lambda: all(f"self.{a}" in inspect.getsource(_get(f"{cg}:ModelCudaGraphManager"))
                     for a in ("hidden_states", "aux_hidden_states", "intermediate_tensors"))),
        ("vllm.v1.worker.gpu.model_states.interface:ModelState.capture_inner_cudagraphs",
         lambda: callable(_get("vllm.v1.worker.gpu.model_states.interface:ModelState")
                          .capture_inner_cudagraphs)),
    ]  # fmt: skip


def _checks() -> list[tuple[str, Callable[[], bool]]]:
    worker = "vllm.v1.worker.gpu_worker:Worker"
    return [
        *[
            (f"{worker}.{m}", lambda m=m: callable(getattr(_get(worker), m)))
            for m in ("init_device", "load_model", "initialize_from_config",
                      "compile_or_warm_up_model")
        ],  # fmt: skip
        (f"{worker}.determine_available_memory(self) honours kv_cache_memory_bytes",
         lambda: _params(_get(worker).determine_available_memory) == ["self"]
         and "kv_cache_memory_bytes" in inspect.getsource(_get(worker).determine_available_memory)),
        (f"{worker}: requested_memory set by init_device, the KV size's budget",
         lambda: "self.requested_memory =" in inspect.getsource(_get(worker).init_device)
         and "self.requested_memory" in inspect.getsource(_get(worker).determine_available_memory)),
        ("vllm.v1.worker.gpu.model_runner:GPUModelRunner.initialize_kv_cache keeps "
         "kv_cache_config (num_blocks)",
         lambda: "self.kv_cache_config = kv_cache_config" in inspect.getsource(
             _get("vllm.v1.worker.gpu.model_runner:GPUModelRunner").initialize_kv_cache)),
        ("vllm.config.cache:CacheConfig.kv_cache_memory_bytes",
         lambda: "kv_cache_memory_bytes" in _fields(_get("vllm.config.cache:CacheConfig"))),
        *_runner_checks(),
        ("vllm.forward_context:BatchDescriptor fields",
         lambda: _fields(_get("vllm.forward_context:BatchDescriptor")) == {
             "num_tokens", "num_reqs", "uniform", "has_lora", "num_active_loras"}),
        ("vllm.compilation.cuda_graph:CUDAGraphEntry(batch_descriptor, cudagraph, output)",
         lambda: {"batch_descriptor", "cudagraph", "output"}
         <= _fields(_get("vllm.compilation.cuda_graph:CUDAGraphEntry"))),
        ("vllm.compilation.cuda_graph:CUDAGraphWrapper(runnable, vllm_config, runtime_mode)",
         lambda: _params(_get("vllm.compilation.cuda_graph:CUDAGraphWrapper").__init__)[:4]
         == ["self", "runnable", "vllm_config", "runtime_mode"]),
        ("vllm.v1.worker.workspace:lock_workspace",
         lambda: callable(_get("vllm.v1.worker.workspace:lock_workspace"))),
        ("vllm.utils.gc_utils:freeze_gc_for_cudagraph_capture",
         lambda: callable(_get("vllm.utils.gc_utils:freeze_gc_for_cudagraph_capture"))),
        ("torch.cuda:CUDAGraph.capture_end",
         lambda: callable(_get("torch.cuda:CUDAGraph").capture_end)),
    ]  # fmt: skip


def check_patch_points() -> list[str]:
    """The patch points the installed vLLM does not have as the plugin expects; [] when all fit."""
    problems = []
    for what, ok in _checks():
        try:
            fits = ok()
        except (ImportError, AttributeError, TypeError, ValueError, OSError, SyntaxError) as e:
            problems.append(f"{what}: {type(e).__name__}: {e}")
            continue
        if not fits:
            problems.append(f"{what}: differs")
    return problems
