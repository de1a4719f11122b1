"""Nothing the plugin does may end vLLM's start-up: every failure of a restore falls back to the
normal capture (MEDUSA_REQUIRE_ARTIFACT=1 makes it an error), a half-built restore is undone,
the restore prepares memory as vLLM's capture_model does, and a vLLM whose patch points differ
is refused with the reason. Against the real installed vLLM (the optional lane)."""

from __future__ import annotations

import gc
import logging
from types import SimpleNamespace

import pytest

pytest.importorskip("vllm.v1.worker.gpu_worker")

from medusa.cuda.errors import CudaError  # noqa: E402
from medusa.integrations.vllm import restore  # noqa: E402
from medusa.integrations.vllm.points import PREPARATION, check_patch_points  # noqa: E402
from medusa.restore.errors import RestoreError  # noqa: E402


@pytest.fixture
def no_accelerator_cache(monkeypatch):
    """torch's CPU build has no accelerator to empty; note what the preparation saw instead."""
    import torch

    seen: list[dict[str, object]] = []
    monkeypatch.setattr(
        torch.accelerator,
        "empty_cache",
        lambda: seen.append({"gc_enabled": gc.isenabled(), "frozen": gc.get_freeze_count()}),
    )
    return seen


def _runner_class():
    class Runner:
        captured = 0

        def capture_model(self, *, profile_only: bool = False) -> int:
            type(self).captured += 1
            return 7

    return Runner


FAILURES = [
    RestoreError("an allocation differs"),
    CudaError("cuGraphInstantiateWithFlags", 2, "CUDA_ERROR_OUT_OF_MEMORY"),
    AttributeError("libcuda.so.1 has no cuGraphInstantiateWithParams"),
    OSError("libmedusa_restore.so: cannot open shared object file"),
    KeyError("graphs"),
    ValueError("vLLM section version 1"),
]


@pytest.mark.parametrize("failure", FAILURES, ids=lambda e: type(e).__name__)
def test_every_restore_failure_falls_back_to_the_normal_capture(
    failure, monkeypatch, caplog, no_accelerator_cache
):
    def fail(runner, artifact):
        raise failure

    monkeypatch.setattr(restore, "restore_into", fail)
    monkeypatch.delenv("MEDUSA_REQUIRE_ARTIFACT", raising=False)
    runner_cls = _runner_class()
    restore.install_restore(runner_cls, "/art")
    with caplog.at_level(logging.WARNING, logger="medusa.vllm"):
        assert runner_cls().capture_model() == 7  # vLLM's own capture, its result
    assert runner_cls.captured == 1
    assert "restore failed, capturing CUDA graphs the normal way" in caplog.text
    assert str(failure) in caplog.text
    if not isinstance(failure, RestoreError):
        assert type(failure).__name__ in caplog.text  # the reason says what kind of failure


@pytest.mark.parametrize("failure", FAILURES[:4], ids=lambda e: type(e).__name__)
def test_require_artifact_makes_a_failed_restore_an_error(
    failure, monkeypatch, no_accelerator_cache
):
    def fail(runner, artifact):
        raise failure

    monkeypatch.setattr(restore, "restore_into", fail)
    monkeypatch.setenv("MEDUSA_REQUIRE_ARTIFACT", "1")
    runner_cls = _runner_class()
    restore.install_restore(runner_cls, "/art")
    with pytest.raises(type(failure)):
        runner_cls().capture_model()
    assert runner_cls.captured == 0


def test_a_missing_artifact_falls_back_and_a_recapture_is_vllms_own(caplog, no_accelerator_cache):
    runner_cls = _runner_class()
    restore.install_restore(runner_cls, "/nonexistent/artifact")
    restore.install_restore(runner_cls, "/nonexistent/artifact")  # once only
    with caplog.at_level(logging.WARNING, logger="medusa.vllm"):
        assert runner_cls().capture_model() == 7
    assert "/nonexistent/artifact: no manifest.json" in caplog.text
    caplog.clear()
    assert runner_cls().capture_model() == 7  # a later re-capture (elastic EP) is vLLM's own
    assert runner_cls.captured == 2 and "restore failed" not in caplog.text


def test_the_restore_runs_inside_capture_models_own_preparation(monkeypatch, no_accelerator_cache):
    from vllm.v1.worker.gpu.model_runner import GPUModelRunner

    from medusa.integrations.vllm.points import preparation

    # vLLM's capture_model, read from its source, prepares exactly as the restore does ...
    assert preparation(GPUModelRunner.capture_model) == PREPARATION
    during: list[dict[str, object]] = []

    def restore_into(runner, artifact):
        during.append({"gc_enabled": gc.isenabled(), "frozen": gc.get_freeze_count()})
        return 5

    monkeypatch.setattr(restore, "restore_into", restore_into)
    runner_cls = _runner_class()
    restore.install_restore(runner_cls, "/art")
    was_enabled = gc.isenabled()
    assert runner_cls().capture_model() == 5 and runner_cls.captured == 0
    # ... and the restore ran after the cache was emptied, with the collector frozen and off,
    # the state vLLM's capture is in; afterwards the collector is back as it was.
    assert len(no_accelerator_cache) == 1 and not no_accelerator_cache[0]["gc_enabled"]
    assert during == [{"gc_enabled": False, "frozen": during[0]["frozen"]}]
    assert during[0]["frozen"] > 0
    assert gc.isenabled() == was_enabled and gc.get_freeze_count() == 0


def test_a_restore_that_fails_half_way_leaves_the_runner_as_it_was(monkeypatch):
    from vllm.config.compilation import CUDAGraphMode
    from vllm.v1.worker.gpu.cudagraph_utils import BatchExecutionDescriptor

    from medusa.integrations.vllm.descriptors import descriptor_key

    released: list[bool] = []

    class FakeRestorer:  # the graphs instantiate; building their outputs then fails
        def __init__(self, art, backend, count=None):
            self.b, self.bases = backend, [[0x1000]]

        def restore(self, stream):
            return SimpleNamespace(execs=[11], methods={})

        def release(self):
            released.append(True)

    def cuda_error(*args):
        raise CudaError("cuMemMap", 2, "CUDA_ERROR_OUT_OF_MEMORY")

    torch = pytest.importorskip("torch")
    monkeypatch.setattr(restore, "Restorer", FakeRestorer)
    monkeypatch.setattr(restore, "load_backend", lambda kind: None)
    monkeypatch.setattr(restore, "build_output", cuda_error)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda: SimpleNamespace(cuda_stream=0))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    desc = BatchExecutionDescriptor(cg_mode=CUDAGraphMode.FULL, num_tokens=8, num_reqs=8)
    art = SimpleNamespace(
        manifest={"vllm": {"graphs": [{"kind": "full", "key": descriptor_key(desc), "graph": 0}],
                           "outputs": {"hidden_states": {"t": "tensor"}}}},
        plan={"allocs": [], "skipped_phases": [], "num_nodes": 1},
    )  # fmt: skip
    mgr = SimpleNamespace(graphs={}, _graphs_captured=False, hidden_states=None,
                          aux_hidden_states=[], intermediate_tensors=None)  # fmt: skip
    wrapper = SimpleNamespace(concrete_cudagraph_entries={})
    with pytest.raises(CudaError):
        restore._build(SimpleNamespace(cudagraph_manager=mgr), art, [wrapper], 0.0)
    assert mgr.graphs == {} and mgr._graphs_captured is False and mgr.hidden_states is None
    assert wrapper.concrete_cudagraph_entries == {} and released == [True]


def test_the_installed_vllms_patch_points_fit():
    assert check_patch_points() == []


def test_a_vllm_whose_patch_points_differ_is_refused_with_the_reason(monkeypatch, caplog):
    from vllm.v1.worker.gpu.model_runner import GPUModelRunner

    import medusa.integrations.vllm as plugin

    def capture_model(self, profile_only=False):  # profile_only no longer keyword-only
        return 0

    monkeypatch.setattr(GPUModelRunner, "capture_model", capture_model)
    problems = check_patch_points()
    assert any("capture_model(self, *, profile_only)" in p for p in problems), problems
    monkeypatch.setattr(plugin, "_registered", False)
    monkeypatch.delenv("MEDUSA_REQUIRE_ARTIFACT", raising=False)
    with caplog.at_level(logging.WARNING, logger="medusa.vllm"):
        plugin.register()  # refuses without raising: vLLM starts as usual
    assert "medusa plugin not installed, vLLM starts as usual" in caplog.text
    assert "capture_model(self, *, profile_only)" in caplog.text
    assert GPUModelRunner.capture_model is capture_model  # nothing was patched
    monkeypatch.setattr(plugin, "_registered", False)
    monkeypatch.setenv("MEDUSA_REQUIRE_ARTIFACT", "1")
    with pytest.raises(plugin.UnsupportedVllm, match="differs from the versions"):
        plugin.register()
