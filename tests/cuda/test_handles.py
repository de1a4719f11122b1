"""Handle kinds, library loading and driver versions as the real driver has them."""

from __future__ import annotations

import pytest

from tests.conftest import lines

# Starts processes (see pyproject.toml's e2e marker): not in the fast subset.
pytestmark = pytest.mark.e2e


def test_library_module_kernel_and_function_are_distinct_handle_kinds(cprog, run):
    out = lines(run(cprog("handles")).stdout)
    assert out, "no checks ran"
    assert {k: v for k, v in out.items() if v != "ok"} == {}


def test_an_older_driver_reports_its_version_and_hides_newer_entry_points(cprog, run):
    res = run(cprog("driver_version"), env={"MEDUSA_SIM_DRIVER_VERSION": "12030"})
    out = lines(res.stdout)
    assert out["version"] == "12030"
    assert out["lookup cuFuncGetParamInfo"] == "CUDA_ERROR_NOT_FOUND"
    assert out["lookup cuFuncGetName"] == "CUDA_SUCCESS"  # 12.3 has it
    assert out["call cuFuncGetParamInfo"] == "CUDA_ERROR_NOT_SUPPORTED"
    assert out["call cuKernelGetParamInfo"] == "CUDA_ERROR_NOT_SUPPORTED"
    assert out["runtime lookup by version"] == "cudaErrorNotSupported"  # a 12.5 runtime API
    assert out["runtime lookup"] == "cudaSuccess"


def test_a_12_4_driver_has_the_parameter_queries_but_not_cuKernelGetLibrary(cprog, run):
    out = lines(run(cprog("driver_version"), env={"MEDUSA_SIM_DRIVER_VERSION": "12040"}).stdout)
    assert out["version"] == "12040"
    assert out["lookup cuFuncGetParamInfo"] == "CUDA_SUCCESS"
    assert out["lookup cuKernelGetLibrary"] == "CUDA_ERROR_NOT_FOUND"
    assert out["call cuFuncGetParamInfo"] == "CUDA_SUCCESS"


def test_the_default_driver_is_the_headers_version(cprog, run):
    out = lines(run(cprog("driver_version")).stdout)
    assert int(out["version"]) >= 13000 and out["lookup cuKernelGetLibrary"] == "CUDA_SUCCESS"
