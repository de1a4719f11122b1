"""The plugin against the real installed vLLM (the optional lane: scripts/test_vllm_lane.sh
installs the `vllm` extra). Skipped where vLLM is not installed."""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import pytest

gpu_worker = pytest.importorskip("vllm.v1.worker.gpu_worker")

from medusa.integrations.vllm.materialize import KV_FLAG  # noqa: E402


def test_the_plugin_is_a_vllm_general_plugin_and_registers_once():
    (ep,) = [e for e in entry_points(group="vllm.general_plugins") if e.name == "medusa"]
    register = ep.load()
    before = {
        m: inspect.signature(getattr(gpu_worker.Worker, m))
        for m in ("load_model", "determine_available_memory", "initialize_from_config")
    }
    register()
    register()  # vLLM may load plugins more than once per process
    from vllm.v1.worker.gpu.model_runner import GPUModelRunner

    from medusa.integrations.vllm.phases import MARKED, PHASES, RUNNER_PHASES

    for cls, phases in ((gpu_worker.Worker, PHASES), (GPUModelRunner, RUNNER_PHASES)):
        for method, phase in phases.items():
            fn = getattr(cls, method)
            assert getattr(fn, MARKED) == phase
            assert getattr(fn.__wrapped__, MARKED, None) is None  # wrapped exactly once
    for m, sig in before.items():  # the patch points keep vLLM's signatures
        assert inspect.signature(getattr(gpu_worker.Worker, m)) == sig
    assert list(inspect.signature(GPUModelRunner.capture_model).parameters) == [
        "self",
        "profile_only",
    ]


def test_patch_points_exist_with_the_expected_shapes():
    import torch
    from vllm.compilation import backends
    from vllm.compilation.cuda_graph import CUDAGraphEntry, CUDAGraphWrapper
    from vllm.v1.worker import gpu_worker as worker_mod
    from vllm.v1.worker.gpu import cudagraph_utils, model_runner
    from vllm.v1.worker.gpu.model_states.interface import ModelState
    from vllm.v1.worker.workspace import lock_workspace

    from medusa.integrations.vllm.capture import VLLM_WRAPPER

    assert {"batch_descriptor", "cudagraph", "output"} <= set(CUDAGraphEntry.__dataclass_fields__)
    assert "concrete_cudagraph_entries" in inspect.getsource(CUDAGraphWrapper.__init__)
    assert list(inspect.signature(CUDAGraphWrapper.__init__).parameters)[:4] == [
        "self", "runnable", "vllm_config", "runtime_mode"
    ]  # fmt: skip
    # CUDA's static graph wrapper is vLLM's own class, resolved by name where it is built
    cuda_src = (Path(worker_mod.__file__).parents[2] / "platforms" / "cuda.py").read_text()
    assert f'return "{VLLM_WRAPPER}"' in cuda_src
    assert "get_static_graph_wrapper_cls()" in inspect.getsource(backends)
    # FULL graphs: a dict of descriptor -> graph, replayed with .replay(); outputs on the manager
    mgr = cudagraph_utils.ModelCudaGraphManager
    src = inspect.getsource(mgr.__init__) + inspect.getsource(cudagraph_utils.CudaGraphManager)
    for attr in ("graphs", "hidden_states", "aux_hidden_states", "intermediate_tensors",
                 "_graphs_captured", "ubatch_runner", "use_breakable_cg"):  # fmt: skip
        assert f"self.{attr}" in src, attr
    assert "self.graphs[desc].replay()" in inspect.getsource(cudagraph_utils.CudaGraphManager)
    capture_src = inspect.getsource(model_runner.GPUModelRunner.capture_model)
    assert "lock_workspace()" in capture_src and callable(lock_workspace)
    assert callable(ModelState.capture_inner_cudagraphs)
    # every torch capture ends in CUDAGraph.capture_end, where the plugin numbers it
    assert "capture_end()" in inspect.getsource(torch.cuda.graph.__exit__)
    assert "kv_cache_memory_bytes" in inspect.getsource(
        worker_mod.Worker.determine_available_memory
    )


def test_the_wrapper_subclass_is_vllms_and_numbers_instances():
    from vllm.compilation.cuda_graph import CUDAGraphWrapper
    from vllm.platforms.interface import Platform
    from vllm.utils.import_utils import resolve_obj_by_qualname

    from medusa.integrations.vllm import capture

    class CudaLike(Platform):
        @classmethod
        def get_static_graph_wrapper_cls(cls) -> str:
            return capture.VLLM_WRAPPER

    class Other(Platform):
        @classmethod
        def get_static_graph_wrapper_cls(cls) -> str:
            return "somewhere.else.Wrapper"

    assert capture.install_graph_wrapper(CudaLike()) and capture.install_graph_wrapper(CudaLike())
    assert not capture.install_graph_wrapper(Other())
    cls = resolve_obj_by_qualname(CudaLike.get_static_graph_wrapper_cls())
    assert issubclass(cls, CUDAGraphWrapper) and cls.__name__ == "MedusaCUDAGraphWrapper"


def test_descriptors_map_to_artifact_keys_and_back():
    from vllm.config.compilation import CUDAGraphMode
    from vllm.forward_context import BatchDescriptor
    from vllm.v1.worker.gpu.cudagraph_utils import BatchExecutionDescriptor

    from medusa.integrations.vllm.descriptors import descriptor_from_key, descriptor_key

    bd = BatchDescriptor(num_tokens=16, num_reqs=None, uniform=False, has_lora=False)
    assert descriptor_from_key(BatchDescriptor, descriptor_key(bd)) == bd
    fields = {f: 1 for f in BatchExecutionDescriptor.__dataclass_fields__}
    fields["cg_mode"] = CUDAGraphMode.FULL
    bed = BatchExecutionDescriptor(**fields)
    key = descriptor_key(bed)
    assert key["fields"]["cg_mode"] == {"enum": "CUDAGraphMode", "name": "FULL"}
    assert (
        descriptor_from_key(BatchExecutionDescriptor, key, {"CUDAGraphMode": CUDAGraphMode}) == bed
    )
    with pytest.raises(ValueError, match="from another vLLM version"):
        descriptor_from_key(
            BatchDescriptor, {"type": "BatchDescriptor", "fields": {"num_tokens": 1}}
        )


@pytest.mark.e2e
def test_engine_arguments_are_read_by_vllms_own_parser():
    # In a fresh process: the parser builds default configs, which need a platform (here the CPU).
    script = (
        "import json, sys; from medusa.integrations.vllm.startup import engine_kwargs; "
        "kw = engine_kwargs(sys.argv[1:]); "
        "kw['compilation_config'] = {k: v.name for k, v in kw['compilation_config'].items()}; "
        "print(json.dumps(kw))"
    )
    args = ["/m", "--max-model-len", "2048", "-cc.cudagraph_mode=FULL_DECODE_ONLY",
            KV_FLAG, "1000"]  # fmt: skip
    res = subprocess.run(
        [sys.executable, "-c", script, *args],
        env={**os.environ, "VLLM_TARGET_DEVICE": "cpu"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    assert json.loads(res.stdout.strip().splitlines()[-1]) == {
        "model": "/m",
        "max_model_len": 2048,
        "kv_cache_memory_bytes": 1000,
        "compilation_config": {"cudagraph_mode": "FULL_DECODE_ONLY"},
    }
