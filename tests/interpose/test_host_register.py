"""The recorder on host registration: each successful cudaHostRegister / cuMemHostRegister is a
host allocation with its device address, each successful unregister its free, in call order with
the other allocations; a failed unregister, or a free of the wrong kind, ends nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from medusa.trace import Ev, read_trace, recorder_env
from medusa.trace import records as R
from medusa.trace.run_view import HOST, RunView
from tests.conftest import lines

# Starts processes (see pyproject.toml's e2e marker): not in the fast subset.
pytestmark = pytest.mark.e2e

PROGRAM_DIR = Path(__file__).parents[1] / "cuda" / "programs"


@pytest.fixture(scope="module")
def recorded(cprog, run, tmp_path_factory):
    prog = cprog("host_register", src_dir=PROGRAM_DIR)
    plain = run(prog)
    trace = tmp_path_factory.mktemp("reg") / "t.mtr"
    rec = run(prog, env=recorder_env(trace))
    return lines(plain.stdout), lines(rec.stdout), read_trace(trace)


def test_the_program_behaves_the_same_under_the_recorder(recorded):
    plain, rec, _ = recorded
    drop = {"file", "pinned", "registered", "driver registered"}  # addresses
    assert {k: v for k, v in plain.items() if k not in drop} == {
        k: v for k, v in rec.items() if k not in drop
    }


def test_registrations_and_unregisters_are_recorded_in_order(recorded):
    _, out, trace = recorded
    ok = [e for e in trace.events(Ev.HOST_ALLOC, Ev.HOST_REGISTER, Ev.HOST_FREE) if e.result == 0]
    seen = [(type(e).__name__, e.api, e.host) for e in ok]
    file, pinned = int(out["file"]), int(out["pinned"])
    reg, drv = int(out["registered"]), int(out["driver registered"])
    assert seen[0] == ("HostRegister", "cudaHostRegister", file)
    assert ("HostRegister", "cudaHostRegister", reg) in seen
    assert ("HostFree", "cudaHostUnregister", reg) in seen
    assert seen.count(("HostFree", "cudaHostUnregister", file)) == 1  # the second one failed
    assert seen[-1] == ("HostFree", "cudaHostUnregister", file)
    i = seen.index(("HostRegister", "cuMemHostRegister_v2", drv))
    # cuMemFreeHost on the registration failed: recorded, but it names no allocation
    assert seen[i + 1 : i + 3] == [
        ("HostFree", "cuMemFreeHost", drv),
        ("HostFree", "cuMemHostUnregister", drv),
    ]
    by_seq = {e.seq: e for e in ok}
    for f in (e for e in ok if isinstance(e, R.HostFree)):
        if f.api.endswith("Unregister"):
            reg = by_seq[f.alloc_seq]
            assert isinstance(reg, R.HostRegister) and reg.host == f.host
        elif f.host == drv:
            assert f.alloc_seq == 0
    # the failed cudaHostUnregister(pinned) did not end the pinned allocation: cudaFreeHost did
    (free_pinned,) = [e for e in ok if isinstance(e, R.HostFree) and e.host == pinned]
    assert free_pinned.api == "cudaFreeHost"
    assert isinstance(by_seq[free_pinned.alloc_seq], R.HostAlloc)


def test_a_registration_carries_its_flags_and_device_address(recorded):
    _, out, trace = recorded
    regs = [e for e in trace.of(R.HostRegister, Ev.HOST_REGISTER) if e.result == 0]
    first = regs[0]
    assert first.host == int(out["file"]) and first.device == first.host
    assert first.flags == 0x02 | 0x08  # cudaHostRegisterMapped | cudaHostRegisterReadOnly
    assert first.size == 2048 * 4
    refused = [e for e in trace.of(R.HostRegister, Ev.HOST_REGISTER) if e.result != 0]
    # invalid value, already registered, not supported (I/O memory)
    assert {e.result for e in refused} >= {1, 712, 801}


def test_analysis_sees_registrations_as_host_allocations_with_their_lifetimes(recorded):
    _, out, trace = recorded
    run = RunView.build(trace, graphs=False)
    regs = [a for a in run.allocs if a.api in ("cudaHostRegister", "cuMemHostRegister_v2")]
    assert all(a.kind == HOST for a in regs)
    (file,) = [a for a in regs if a.addr == int(out["file"])]
    assert file.size == 2048 * 4 and file.free_seq > file.seq
    ends = [i for op, i in run.events if op == "f"]
    assert len(ends) == len(set(ends))  # nothing ended twice
