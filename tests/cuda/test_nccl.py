"""libmedusa_nccl: NCCL's API over shared memory between rank processes on simcuda. Collectives
give every rank the same exact results, run inside captured graphs, fail with NCCL's error
codes on bad use, and a dead rank ends the others' collectives within the timeout instead of
hanging them. The segment the ranks meet in is exclusive, private and gone once they joined."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from medusa.cuda import load_backend
from medusa.cuda.nccl import Nccl, NcclError
from tests.processes import clean_env

# Starts processes (see pyproject.toml's e2e marker): not in the fast subset.
pytestmark = pytest.mark.e2e

PROGRAM = Path(__file__).parent / "programs" / "nccl_rank.py"
COUNT = 3000


@pytest.fixture(scope="module")
def nccl():
    return Nccl(load_backend("sim"))


def ranks(nccl: Nccl, n: int, *extra: str, **env: str) -> list[subprocess.CompletedProcess]:
    """Runs the rank program as N processes of one communicator; their results."""
    uid = nccl.unique_id().hex()
    procs = [
        subprocess.Popen(
            [sys.executable, str(PROGRAM), uid, str(n), str(r), *extra],
            env={**clean_env(), "MEDUSA_NCCL_SLOT_BYTES": "4096", **env},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        for r in range(n)
    ]
    return [subprocess.CompletedProcess(p.args, p.wait(60), *p.communicate()) for p in procs]


@pytest.mark.parametrize("n", [2, 4])
def test_every_rank_gets_the_same_exact_results_eager_and_in_a_graph(nccl, n):
    done = ranks(nccl, n)
    assert [p.returncode for p in done] == [0] * n, [p.stderr[-800:] for p in done]
    outs = [json.loads(p.stdout) for p in done]
    assert all(o == outs[0] for o in outs)  # bit-identical on every rank
    out = outs[0]
    # rank r sends r*1000 + i: 3000 floats, more than one 4 KiB slot, so the sum goes in chunks
    assert out["all_reduce"] == [1000.0 * n * (n - 1) / 2 + n * i for i in range(COUNT)]
    assert out["max_in_place"] == [1000.0 * (n - 1) + i for i in range(3)]
    assert out["all_gather"] == [r * 10 + k for r in range(n) for k in range(5)]
    # a captured all-reduce, replayed on new inputs each time: sum of (r + 1) x scale
    total = n * (n + 1) / 2
    assert out["graph_replays"] == [total, 3 * total]


def test_a_dead_rank_fails_the_others_collectives_within_the_timeout(nccl):
    done = ranks(nccl, 3, "die", MEDUSA_NCCL_TIMEOUT="1.5")
    survivors = [json.loads(done[r].stdout) for r in (0, 2)]
    for s in survivors:
        assert "cudaErrorLaunchFailure" in s["error"] and "dead or stopped" in s["error"]
        assert s["seconds"] < 10 and s["async_error"] == 6  # ncclRemoteError


def test_ranks_that_call_different_collectives_fail_instead_of_pairing_wrongly(nccl):
    # rank 0 sums 3000 floats, the others 1000: NCCL leaves this undefined; here every rank's
    # launch fails at the first meeting, naming the cause, rather than return mixed sums
    done = ranks(nccl, 3, "mismatch", MEDUSA_NCCL_TIMEOUT="20")
    for p in done:
        out = json.loads(p.stdout)
        assert "called different collectives" in out["error"] and out["seconds"] < 10


def test_bad_use_gets_nccls_error_codes(nccl):
    uid = nccl.unique_id()
    cases = [
        (lambda: nccl.init_rank(2, b"\1" * 128, 0), 4, "not an id from ncclGetUniqueId"),
        (lambda: nccl.init_rank(0, uid, 0), 4, "rank 0 of 0"),
        (lambda: nccl.init_rank(2, uid, 2), 4, "rank 2 of 2"),
        (lambda: nccl.init_rank(9, uid, 0), 4, "1 to 8 ranks"),
    ]
    os.environ["MEDUSA_NCCL_SLOT_BYTES"] = str(1 << 63)  # would wrap the segment's size
    try:
        with pytest.raises(NcclError, match="64 bytes to 1 GiB"):
            nccl.init_rank(1, uid, 0)
    finally:
        del os.environ["MEDUSA_NCCL_SLOT_BYTES"]
    for call, code, why in cases:
        with pytest.raises(NcclError, match=why) as e:
            call()
        assert e.value.code == code
    assert nccl.lib.ncclAllReduce(None, None, 4, 7, 0, None, None) == 4  # no communicator
    assert nccl.lib.ncclGroupEnd() == 5  # ncclInvalidUsage: no group was started
    assert nccl.lib.ncclGroupStart() == 0 and nccl.lib.ncclGroupEnd() == 0


def test_a_one_rank_communicator_reduces_and_leaves_no_segment(nccl):
    before = set(os.listdir("/dev/shm"))
    comm = nccl.init_rank(1, nccl.unique_id(), 0)
    assert set(os.listdir("/dev/shm")) == before  # unlinked once every rank joined
    with pytest.raises(NcclError, match="data type 42") as e:
        comm.nccl.check("ncclAllReduce", nccl.lib.ncclAllReduce(16, 16, 4, 42, 0, comm.handle, 0))
    assert e.value.code == 4
    comm.destroy()


def _name(uid: bytes) -> str:
    return uid[8:56].split(b"\0")[0].decode()  # mnccl_id: magic, then the segment's name


def test_a_planted_or_foreign_segment_is_refused(nccl, tmp_path):
    # another local user who learns the name first cannot make rank 0 use their file ...
    uid = nccl.unique_id()
    planted = Path("/dev/shm") / _name(uid).lstrip("/")
    planted.write_bytes(b"\0" * 8192)
    try:
        with pytest.raises(NcclError, match="another process made that name") as e:
            nccl.init_rank(1, uid, 0)
        assert e.value.code == 2
        # ... nor make another rank join a segment that is not rank 0's (mode, size)
        os.chmod(planted, 0o644)
        script = (
            "import sys; from medusa.cuda import load_backend; from medusa.cuda.nccl import "
            "Nccl, NcclError\ntry: Nccl(load_backend('sim')).init_rank(2, bytes.fromhex("
            "sys.argv[1]), 1)\nexcept NcclError as e: print(e)"
        )
        res = subprocess.run([sys.executable, "-c", script, uid.hex()], env=clean_env(),
                             capture_output=True, text=True, timeout=60)  # fmt: skip
        assert "is not the segment rank 0 made" in res.stdout, res.stderr
    finally:
        planted.unlink()


BOARD = (
    "import ctypes; from medusa.cuda import load_backend, paths; load_backend('sim').mem_get_info()"
    "\nlib = ctypes.CDLL(str(paths.library('simcuda'))); u = ctypes.create_string_buffer(16)"
    "\nbus = ctypes.c_int(); lib.cuDeviceGetUuid_v2(u, 0)"
    "\nlib.cuDeviceGetAttribute(ctypes.byref(bus), 33, 0)"  # 33: CU_DEVICE_ATTRIBUTE_PCI_BUS_ID
    "\nprint(u.raw.hex(), bus.value)"
)


def test_each_rank_process_has_its_own_board():
    # one process per device, as vLLM's workers: the board index gives each its own identity
    seen = [
        subprocess.run([sys.executable, "-c", BOARD], capture_output=True, text=True, timeout=60,
                       env={**clean_env(), "MEDUSA_SIM_DEVICE_INDEX": str(i)}).stdout.split()
        for i in (0, 1, 1)
    ]  # fmt: skip
    assert seen[1] == seen[2] and seen[0][0] != seen[1][0]  # a board's UUID is stable
    assert [int(s[1]) for s in seen] == [0x19, 0x1A, 0x1A]
