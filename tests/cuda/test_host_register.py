"""simcuda host registration: a read-only file mapping registered for the device, as the shared
weight store is, with CUDA's flags, errors and attributes, and a device write into it refused."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.conftest import lines

# Starts processes (see pyproject.toml's e2e marker): not in the fast subset.
pytestmark = pytest.mark.e2e

VERBOSE = {"MEDUSA_SIM_VERBOSE": "1"}


@pytest.fixture(scope="module")
def prog(cprog):
    return cprog("host_register")


def fs_type(path: Path) -> str:
    return subprocess.run(["stat", "-f", "-c", "%T", str(path)], capture_output=True, text=True,
                          check=True).stdout.strip()  # fmt: skip


def test_a_shared_file_on_disk_is_refused_for_device_writes_as_linux_refuses_the_driver(
    prog, run, build_dir
):
    """The driver pins registered pages for writing, long-term: Linux (6.5 on) refuses that for
    a shared mapping of a file on a filesystem that writes back (say, an exchange region in /tmp
    on a disk), not for one on tmpfs, nor for a read-only registration."""
    if fs_type(build_dir) in ("tmpfs", "ramfs"):
        pytest.skip(f"{build_dir} is on tmpfs here: no disk filesystem to try")
    out = lines(run(prog, "shared-file", str(build_dir)).stdout)
    assert out["writable shared file"] == "cudaErrorInvalidValue"
    assert out["read-only shared file"] == "cudaSuccess"
    if Path("/dev/shm").is_dir() and fs_type(Path("/dev/shm")) == "tmpfs":
        out = lines(run(prog, "shared-file", "/dev/shm").stdout)
        assert out["writable shared file"] == out["read-only shared file"] == "cudaSuccess"


def test_registration_follows_cuda_rules(prog, run):
    out = lines(run(prog).stdout)
    assert out["read-only mapping without the flag"] == "cudaErrorInvalidValue"
    assert out["size 0"] == out["null"] == out["unknown flag"] == "cudaErrorInvalidValue"
    assert out["io memory"] == "cudaErrorNotSupported"
    assert out["device memory"] == out["unmapped"] == "cudaErrorInvalidValue"
    assert out["same pointer"] == "1"
    for overlap in ("same range again", "range around it", "range into it", "register pinned"):
        assert out[overlap] == "cudaErrorHostMemoryAlreadyRegistered", overlap
    assert out["next to it"] == "cudaSuccess"
    assert out["default flags are mapped"] == "cudaSuccess"  # unified addressing
    assert out["interior unregister"] == "cudaErrorHostMemoryNotRegistered"
    assert out["unregister pinned"] == "cudaErrorHostMemoryNotRegistered"


def test_registered_memory_reports_itself_as_read_only_host_memory(prog, run):
    out = lines(run(prog).stdout)
    assert out["type"] == "1"  # cudaMemoryTypeHost
    assert out["pointers"] == "1"
    assert out["range"] == f"1 {2048 * 4}"
    assert out["access read-only"] == "1"
    assert out["read-only supported"] == "1"


def test_kernels_read_it_and_unregister_ends_it(prog, run):
    out = lines(run(prog).stdout)
    assert out["sum ok"] == "1"
    assert out["host-mapped bytes read"] == str(2048 * 4)
    assert out["unregister"] == "cudaSuccess"
    assert out["unregister again"] == "cudaErrorHostMemoryNotRegistered"
    assert out["device pointer after"] == "cudaErrorInvalidValue"
    assert out["type after"] == "0"  # cudaMemoryTypeUnregistered


def test_registration_is_refused_while_capturing_by_capture_mode(prog, run):
    out = lines(run(prog).stdout)
    assert out["register while capturing"] == "cudaErrorStreamCaptureUnsupported"
    assert out["capture after"] == "cudaErrorStreamCaptureInvalidated"
    assert out["register in relaxed capture"] == "cudaSuccess"
    assert out["unregister in relaxed capture"] == "cudaSuccess"


def test_a_copy_into_read_only_memory_is_refused(prog, run):
    api = lines(run(prog).stdout)
    assert api["memset into read-only"] == "cudaErrorInvalidValue"
    res = run(prog, "memcpy-into", env=VERBOSE)
    out = lines(res.stdout)
    assert out["memcpy into read-only"] == "cudaErrorInvalidValue"
    assert out["context after"] == "cudaSuccess"
    assert "registered read-only" in res.stderr


def test_a_kernel_writing_a_read_only_file_mapping_faults(prog, run):
    res = run(prog, "write-file", env=VERBOSE)
    assert lines(res.stdout)["write kernel"] == "cudaErrorIllegalAddress"
    assert "kernel scale_inplace wrote to" in res.stderr
    assert "CU_MEMHOSTREGISTER_READ_ONLY" in res.stderr


def test_memcheck_traps_a_kernel_writing_writable_memory_registered_read_only(prog, run):
    res = run(prog, "write-anon", env={"MEDUSA_SIM_MEMCHECK": "1", **VERBOSE})
    out = lines(res.stdout)
    assert out["write kernel"] == "cudaErrorIllegalAddress"
    assert out["host writes"] == "1"
    assert "kernel scale_inplace wrote to" in res.stderr
    # Without memcheck the CPU's own mapping is writable, so nothing notices (as with stale
    # pointers): memcheck is what catches it.
    assert lines(run(prog, "write-anon").stdout)["write kernel"] == "cudaSuccess"


def test_memcheck_refuses_registered_memory_after_unregister(prog, run):
    res = run(prog, "after-unregister", env={"MEDUSA_SIM_MEMCHECK": "1", **VERBOSE})
    assert lines(res.stdout)["read after unregister"] == "cudaErrorIllegalAddress"
    assert "kernel vector_add argument 2" in res.stderr


def test_the_driver_entry_points_register_too(prog, run):
    out = lines(run(prog).stdout)
    assert out["driver pointer"] == "1"
    assert out["free host on registered"] == "cudaErrorInvalidValue"
