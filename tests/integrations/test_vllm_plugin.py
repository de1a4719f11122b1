"""The plugin against the real installed vLLM (the optional lane: scripts/test_vllm_lane.sh
installs the `vllm` extra). Skipped where vLLM is not installed."""

from __future__ import annotations

import inspect
from importlib.metadata import entry_points

import pytest

gpu_worker = pytest.importorskip("vllm.v1.worker.gpu_worker")


def test_the_plugin_is_a_vllm_general_plugin_and_registers_once():
    (ep,) = [e for e in entry_points(group="vllm.general_plugins") if e.name == "medusa"]
    register = ep.load()
    before = {
        m: inspect.signature(getattr(gpu_worker.Worker, m))
        for m in ("load_model", "determine_available_memory", "initialize_from_config")
    }
    register()
    register()  # vLLM may load plugins more than once per process
    from medusa.integrations.vllm.phases import MARKED, PHASES

    for method, phase in PHASES.items():
        fn = getattr(gpu_worker.Worker, method)
        assert getattr(fn, MARKED) == phase
        assert getattr(fn.__wrapped__, MARKED, None) is None  # wrapped exactly once
    for m, sig in before.items():  # the patch points keep vLLM's signatures
        assert inspect.signature(getattr(gpu_worker.Worker, m)) == sig


def test_patch_points_exist_with_the_expected_shapes():
    from vllm.compilation.cuda_graph import CUDAGraphEntry, CUDAGraphWrapper
    from vllm.v1.worker.gpu import cudagraph_utils, model_runner

    assert {"batch_descriptor", "cudagraph", "output"} <= set(CUDAGraphEntry.__dataclass_fields__)
    assert "concrete_cudagraph_entries" in inspect.getsource(CUDAGraphWrapper.__init__)
    mgr = cudagraph_utils.CudaGraphManager
    assert {"capture", "run_fullgraph", "dispatch"} <= set(dir(mgr))
    assert "self.graphs" in inspect.getsource(mgr)
    assert "profile_only" in inspect.signature(model_runner.GPUModelRunner.capture_model).parameters


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
