"""The Python binding: errors as exceptions with CUDA names, back-end selection."""

from __future__ import annotations

import struct
import subprocess
import sys

import pytest

from medusa.cuda import CudaError, load_backend


@pytest.fixture(scope="module")
def sim():
    b = load_backend("sim")
    b.load_kernels("simcuda_testkernels")
    return b


def test_errors_become_exceptions_naming_the_cuda_error(sim):
    with pytest.raises(CudaError) as info:
        sim.malloc(1 << 50)
    assert info.value.name == "cudaErrorMemoryAllocation"
    assert "cudaMalloc" in str(info.value)


def test_graph_capture_from_python_replays_the_same_result(sim):
    n = 256
    a, c = sim.malloc(4 * n), sim.malloc(4 * n)
    sim.memcpy_htod(a, struct.pack(f"{n}f", *range(n)))
    s = sim.stream_create()
    sim.begin_capture(s)
    sim.launch("vector_add", 1, 256, [c, a, a, n], stream=s)
    graph = sim.end_capture(s)
    assert sim.graph_num_nodes(graph) == 1
    sim.memset(c, 0, 4 * n)
    sim.graph_launch(sim.graph_instantiate(graph), s)
    assert struct.unpack(f"{n}f", sim.memcpy_dtoh(c, 4 * n)) == tuple(2.0 * i for i in range(n))


def test_an_unknown_back_end_is_refused_with_the_choices():
    with pytest.raises(ValueError, match="expected auto, cuda or sim"):
        load_backend("tpu")


@pytest.mark.e2e
def test_calls_resolve_in_global_scope_so_a_preload_sees_them(cprog, tmp_path):
    shim = cprog("procshim", libs=(), shared=True)
    code = (
        "from medusa.cuda import load_backend; b = load_backend('sim'); "
        "b.load_kernels('simcuda_testkernels'); p = b.malloc(64); "
        "b.launch('scale_inplace', 1, 32, [p, __import__('ctypes').c_float(2.0), 16])"
    )
    res = subprocess.run(
        [sys.executable, "-c", code],
        env={"LD_PRELOAD": str(shim), "PATH": "/usr/bin"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr
    assert "cuLaunchKernel=1" in res.stderr
