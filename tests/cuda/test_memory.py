"""simcuda memory: addresses differ per process, freed ranges come back, bad input is refused."""

from __future__ import annotations

import pytest

from tests.conftest import lines

# Starts processes (see pyproject.toml's e2e marker): not in the fast subset.
pytestmark = pytest.mark.e2e


def test_two_processes_get_different_addresses(cprog, run):
    prog = cprog("basics")
    first = [lines(run(prog).stdout)["first"] for _ in range(3)]
    assert len(set(first)) == 3, first


def test_seed_fixes_the_base_address(cprog, run):
    prog = cprog("basics")
    a = lines(run(prog, env={"MEDUSA_SIM_SEED": "7"}).stdout)["first"]
    b = lines(run(prog, env={"MEDUSA_SIM_SEED": "7"}).stdout)["first"]
    c = lines(run(prog, env={"MEDUSA_SIM_SEED": "8"}).stdout)["first"]
    assert a == b != c


def test_a_freed_address_is_handed_out_again(cprog, run):
    out = lines(run(cprog("basics")).stdout)
    assert out["first"] == out["reused"]


def test_bad_input_gets_the_real_errors_and_no_crash(cprog, run):
    out = lines(run(cprog("bad_input")).stdout)
    assert out["huge malloc"] == "cudaErrorMemoryAllocation"
    assert out["last error"] == "cudaErrorMemoryAllocation"
    assert out["last error again"] == "cudaSuccess"
    assert out["arena intact"] == "1"
    assert out["free interior"] == "cudaErrorInvalidValue"
    assert out["double free"] == "cudaErrorInvalidValue"
    assert out["unknown stub"] == "cudaErrorInvalidDeviceFunction"
    assert out["zero grid"] == "cudaErrorInvalidConfiguration"  # the runtime's own check
    assert out["2048 threads"] == "cudaErrorInvalidConfiguration"
    assert out["64K smem"] == "cudaErrorInvalidValue"
    assert out["64K smem after attribute"] == "cudaSuccess"
    assert out["bad kind"] == "cudaErrorInvalidMemcpyDirection"
    assert out["end without begin"] == "cudaErrorIllegalState"
    assert out["bad device"] == "cudaErrorInvalidDevice"
    assert out["sync captured event"] == "cudaErrorCapturedEvent"


def test_input_the_real_runtime_leaves_undefined_gets_an_error_and_no_crash(cprog, run):
    out = lines(run(cprog("undefined_input")).stdout)
    assert out["bad stream"] == "cudaErrorInvalidResourceHandle"
    assert out["bad graph launch"] == "cudaErrorInvalidValue"
    assert out["copy from freed"] == "cudaErrorInvalidValue"
    assert out["copy past end"] == "cudaErrorInvalidValue"
    assert out["copy to null"] == out["copy from null"] == "cudaErrorInvalidValue"
    assert out["fill null"] == "cudaErrorInvalidValue"


def test_memcheck_names_the_kernel_and_argument_of_a_stale_pointer(cprog, run):
    prog = cprog("memcheck")
    checked = run(prog, env={"MEDUSA_SIM_MEMCHECK": "1", "MEDUSA_SIM_VERBOSE": "1"})
    out = lines(checked.stdout)
    assert out["stale launch"] == "cudaErrorIllegalAddress"
    assert out["after"] == "cudaErrorIllegalAddress"  # sticky, as on a GPU
    assert "kernel scale_inplace argument 0" in checked.stderr
    # Without memcheck the stale range is still mapped arena memory: nothing notices.
    assert lines(run(prog).stdout)["stale launch"] == "cudaSuccess"


def test_traffic_counters_split_device_and_host_mapped_reads(cprog, run):
    out = lines(run(cprog("traffic")).stdout)
    assert out["device"] == "4000"
    assert out["host"] == "4000"


def test_fresh_memory_holds_stale_bytes_that_differ_per_process(cprog, run):
    prog = cprog("stale")
    a, b = lines(run(prog).stdout), lines(run(prog).stdout)
    for key in ("small word", "reused word", "big word"):
        assert int(a[key], 16) != 0 and a[key] != b[key], (key, a[key], b[key])
    assert a["big written"] == "1"


def test_poison_can_be_turned_off(cprog, run):
    out = lines(run(cprog("stale"), env={"MEDUSA_SIM_POISON": "0"}).stdout)
    assert out["small word"] == out["reused word"] == out["big word"] == "0"


def test_large_blocks_take_whole_2mib_pages(cprog, run):
    out = lines(run(cprog("stale")).stdout)
    assert out["pad costs"] == str(4 << 20)  # 2 MiB + 4 KiB occupies two pages, as on a GPU
    assert out["pad aligned"] == "1"


def test_copies_over_stale_bytes_read_back_exactly(cprog, run):
    # A copy that overwrites most of a 2 MiB page of a large block gives the page fresh memory (the
    # stale-byte mapping would cost a fault and a 4 KiB copy per page): the bytes the copy does
    # not reach keep their stale pattern, bytes written before survive, and two threads copying
    # into the same pages side by side lose nothing.
    prog = cprog("fresh_pages", extra=("-pthread",))
    for env in ({}, {"MEDUSA_SIM_ACCESSES": "1"}):
        out = lines(run(prog, env=env).stdout)
        assert out["block exact"] == "1", env
        assert out["side by side exact"] == "1", env
