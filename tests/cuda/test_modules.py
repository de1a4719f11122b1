"""Hidden kernels, module images, and the runtime reaching the driver via cuGetProcAddress."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import lines

# Starts processes (see pyproject.toml's e2e marker): not in the fast subset.
pytestmark = pytest.mark.e2e


def _shim(cprog) -> Path:
    return cprog("procshim", libs=(), shared=True)


def test_hidden_kernel_appears_only_after_first_use_and_is_found_by_enumeration(cprog, run):
    res = run(cprog("hidden"), env={"LD_PRELOAD": str(_shim(cprog))})
    out = lines(res.stdout)
    assert out["exported"] == "0"
    assert out["product"] == "7 10 15 22"
    assert out["runtime params"] == "cudaErrorInvalidDeviceFunction"  # no host stub to give back
    assert "enumerated: _ZN7testblas11sgemm_nn_f3EiiiPKfS1_Pf params=6 same=1" in res.stdout
    err = res.stderr.splitlines()
    loads = [i for i, line in enumerate(err) if line.startswith("shim: cuLibraryLoadData")]
    before = err.index("marker: before first use")
    after = err.index("marker: after first use")
    assert len([i for i in loads if i < before]) == 1  # testkernels, at runtime init
    assert len([i for i in loads if before < i < after]) == 1  # testblas, at first use


def test_runtime_launches_reach_the_driver_through_cuGetProcAddress(cprog, run):
    res = run(cprog("basics"), env={"LD_PRELOAD": str(_shim(cprog))})
    counts = res.stderr.strip().splitlines()[-1]
    assert "cuLaunchKernel=4" in counts  # two eager launches, two during capture
    assert "cuLaunchKernel_ptsz=0" in counts


def test_per_thread_launches_reach_the_ptsz_variant(cprog, run):
    prog = cprog("basics", extra=("-DCUDA_API_PER_THREAD_DEFAULT_STREAM",))
    res = run(prog, env={"LD_PRELOAD": str(_shim(cprog))})
    assert "cuLaunchKernel=0 cuLaunchKernel_ptsz=4" in res.stderr


def test_a_saved_image_reloads_in_a_fresh_process(cprog, run, tmp_path):
    run(cprog("hidden"), env={"LD_PRELOAD": str(_shim(cprog)), "SHIM_SAVE_DIR": str(tmp_path)})
    image = tmp_path / "image_1.bin"  # image_0 is testkernels, image_1 testblas
    res = run(cprog("reload"), str(image))
    assert "reloaded _ZN7testblas11sgemm_nn_f3EiiiPKfS1_Pf: 7 10 15 22" in res.stdout


def test_a_corrupt_image_is_refused(cprog, run, tmp_path):
    run(cprog("hidden"), env={"LD_PRELOAD": str(_shim(cprog)), "SHIM_SAVE_DIR": str(tmp_path)})
    res = run(cprog("reload"), str(tmp_path / "image_1.bin"), "corrupt")
    assert lines(res.stdout)["load"] == "cudaErrorInvalidKernelImage"
