"""simcuda capture and graphs."""

from __future__ import annotations

import pytest

from tests.conftest import lines

# Starts processes (see pyproject.toml's e2e marker): not in the fast subset.
pytestmark = pytest.mark.e2e


def test_graph_replay_is_bit_identical_to_eager(cprog, run):
    out = lines(run(cprog("basics")).stdout)
    assert out["nodes"] == "2"
    assert out["identical"] == "1"


def test_a_sync_during_capture_fails_the_capture(cprog, run):
    out = lines(run(cprog("basics")).stdout)
    assert out["sync during capture"] == "cudaErrorStreamCaptureUnsupported"
    assert out["end capture"] == "cudaErrorStreamCaptureInvalidated graph=(nil)"


def test_capture_rules(cprog, run):
    res = run(cprog("capture_rules"))
    out = lines(res.stdout)
    assert "forkjoin nodes=3 edges=3" in res.stdout
    assert out["unjoined"] == "cudaErrorStreamCaptureUnjoined"
    assert out["legacy launch"] == "cudaErrorStreamCaptureImplicit"
    assert out["end after implicit"] == "cudaErrorStreamCaptureInvalidated"
    assert out["malloc global"] == "cudaErrorStreamCaptureUnsupported"
    assert out["end global"] == "cudaErrorStreamCaptureInvalidated"
    assert out["malloc relaxed"] == "cudaSuccess"
    assert out["end relaxed"] == "cudaSuccess"
    assert out["capture legacy"] == "cudaErrorStreamCaptureUnsupported"
    assert out["capture per-thread"] == "cudaSuccess"
    assert out["end per-thread"] == "cudaSuccess"


def test_programmatic_launch_becomes_a_programmatic_edge(cprog, run):
    res = run(cprog("capture_rules"))
    assert "pdl edge type=1 from_port=1" in res.stdout
    assert lines(res.stdout)["edges without data"] == "cudaErrorLossyQuery"


def test_struct_pointer_array_and_global_kernels_in_a_graph(cprog, run):
    stdout = run(cprog("kernels"), env={"MEDUSA_SIM_MEMCHECK": "1"}).stdout
    out = lines(stdout)
    assert out["graph result ok"] == "1"
    assert "axpy param0 offset=0 size=24" in stdout
    assert out["axpy param1"] == "cudaErrorInvalidValue"
    assert "gather param3 offset=20 size=4" in stdout
    assert "global bias=1.5 size=4" in stdout


def test_a_cooperative_kernel_node_takes_kernel_params_never_extra(cprog, run):
    out = lines(run(cprog("node_params")).stdout)
    assert out["cooperative with extra"] == "cudaErrorInvalidValue"
    assert out["cooperative with kernelParams"] == "cudaSuccess"
    assert out["extra on a cooperative node"] == "cudaErrorInvalidValue"


def test_memcheck_refuses_an_access_policy_window_outside_every_allocation(cprog, run):
    out = lines(run(cprog("node_params"), env={"MEDUSA_SIM_MEMCHECK": "1"}).stdout)
    assert out["window inside"] == "cudaSuccess"
    assert out["window outside"] == "cudaErrorInvalidValue"
    assert lines(run(cprog("node_params")).stdout)["window outside"] == "cudaSuccess"


def test_copy_and_fill_parameters_are_checked_as_cuda_h_asks(cprog, run):
    out = lines(run(cprog("copy_params")).stdout)
    assert out["copy node, pitch 0"] == "cudaSuccess"  # one row: the driver ignores a pitch 0
    assert out["copy node, pitch below its row"] == "cudaErrorInvalidValue"
    assert out["copy node, pitch of its row"] == "cudaSuccess"
    assert out["fill node, pitch below its row"] == "cudaErrorInvalidValue"
    assert out["fill node, pitch above its row"] == "cudaSuccess"
    assert out["cudaMemset2D, pitch below its row"] == "cudaErrorInvalidValue"


def test_a_captured_copy_and_pitched_fill_read_back_as_they_were_made(cprog, run):
    out = lines(run(cprog("copy_params")).stdout)
    assert out["captured copy, added again"] == "cudaSuccess"
    assert out["captured fill"] == "pitch 64 rows 3"
    assert out["fill replayed"] == "120 of 120 row bytes, 72 of 72 gap bytes kept"
