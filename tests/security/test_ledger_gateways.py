"""Issue 30: two gateways on one ledger, tried as an attacker would. Two gateways of one user on
one topology file each keep their ledgers in a directory of their own: what one holds is never
counted, changed or removed by the other, and both serve. On real devices (a GPU, a MIG slice) a
second gateway of the user is refused at start, naming the slices and the gateway holding them:
two would each count the whole device. A gateway killed with SIGKILL leaves its directory, which
the next one removes."""

from __future__ import annotations

import multiprocessing as mp
import signal
from pathlib import Path

import httpx
import pytest

from medusa.prism.ledger import PageLedger
from medusa.serve.gateway.claims import claim_devices, release
from medusa.serve.gateway.slices import Slice
from tests.security._shm import start_gateway, stop_gateway, wait_gateway
from tests.security.test_ledger_files import SHM, elastic_config, ledger_of

# Starts processes (see pyproject.toml's e2e marker): not in the fast subset.
pytestmark = pytest.mark.e2e


def _free(base: str) -> float:
    for line in httpx.get(f"{base}/metrics", timeout=30).text.splitlines():
        if line.startswith('medusa_prism_ledger_pages{slice="s0",state="free"}'):
            return float(line.split()[-1])
    raise AssertionError("no free pages in /metrics")


def _ask(base: str) -> int:
    body = {"model": "tiny", "prompt": "once upon a time", "max_tokens": 4, "temperature": 0}
    r = httpx.post(f"{base}/v1/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return int(r.json()["usage"]["completion_tokens"])


def test_two_gateways_on_one_topology_keep_apart_and_a_killed_ones_files_go(tmp_path):
    config = elastic_config(tmp_path)
    (a, a_base), (b, b_base) = start_gateway(config), start_gateway(config)
    try:
        wait_gateway(a, a_base)
        wait_gateway(b, b_base)
        mine, theirs = ledger_of(a.pid), ledger_of(b.pid)
        assert mine.parent != theirs.parent
        squatter = PageLedger(theirs)  # all of b's pages taken: a does not notice
        squatter.join("squatter")
        assert squatter.try_acquire(512)
        assert (_free(a_base), _free(b_base)) == (512, 0)
        assert _ask(a_base) == 4
        squatter.leave()
        assert _ask(b_base) == 4 and _free(b_base) > 0  # its squatter gone, b serves too
        squatter.close()
        b.send_signal(signal.SIGKILL)  # b leaves its directory behind
        b.wait(30)
        assert theirs.exists()
        c, c_base = start_gateway(config)
        try:
            wait_gateway(c, c_base)
            assert not theirs.parent.exists() and mine.exists()  # b's swept, a's kept
        finally:
            stop_gateway(c)
    finally:
        stop_gateway(a)
        stop_gateway(b)
    assert not list(SHM.glob(f"medusa-shm-{a.pid}-*"))


def _hold_devices(where: str, held: mp.Queue, done: mp.Queue) -> None:
    fds = claim_devices(_gpus(), Path(where))
    held.put(len(fds))
    done.get(timeout=60)


def _gpus() -> list[Slice]:
    return [Slice(f"MIG-{i}", 12 << 30, 16, {"CUDA_VISIBLE_DEVICES": f"MIG-{i}"}) for i in "ab"]


def test_a_second_gateway_on_the_same_devices_is_refused(tmp_path):
    ctx = mp.get_context("spawn")
    held, done = ctx.Queue(), ctx.Queue()
    first = ctx.Process(target=_hold_devices, args=(str(tmp_path), held, done))
    first.start()
    try:
        assert held.get(timeout=60) == 2
        sims = [Slice("sim0", 8 << 30, 132, {"MEDUSA_DEVICE": "sim"})]
        assert claim_devices(sims, tmp_path) == []  # simulated slices share nothing
        with pytest.raises(ValueError, match=rf"MIG-a \(pid {first.pid}\), MIG-b \(pid "):
            claim_devices(_gpus(), tmp_path)
        done.put("exit")
        first.join(60)
    finally:
        first.kill()
    fds = claim_devices(_gpus(), tmp_path)  # its gateway stopped: the devices are free
    assert len(fds) == 2
    release(fds)
