"""The page ledger shared by the workers on one device: never more pages out than the device has,
all-or-nothing requests, and a worker that dies without saying so gives its pages back."""

from __future__ import annotations

import multiprocessing as mp
import os
import random

import pytest

from medusa.prism.ledger import LedgerError, PageLedger

CAPACITY = 24


def _churn(path: str, seed: int, rounds: int, out: mp.Queue) -> None:
    rng = random.Random(seed)
    ledger = PageLedger(path)
    ledger.join(f"w{seed}")
    got = refused = over = 0
    for _ in range(rounds):
        n = rng.randint(1, 6)
        if ledger.try_acquire(n):
            got += 1
            over += ledger.free() < 0
            ledger.release(n)
        else:
            refused += 1
    out.put((got, refused, over, ledger.held()))
    ledger.leave()


@pytest.mark.e2e
def test_workers_never_hold_more_pages_than_the_device_has(tmp_path):
    path = tmp_path / "ledger"
    ledger = PageLedger.create(path, CAPACITY, 2 << 20)
    ledger.join("gateway-probe")
    assert ledger.try_acquire(CAPACITY - 4)  # leaves 4 pages for four churning workers
    out: mp.Queue = mp.Queue()
    procs = [mp.Process(target=_churn, args=(str(path), s, 300, out)) for s in range(4)]
    for p in procs:
        p.start()
    results = [out.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(timeout=30)
    assert all(over == 0 and held == 0 for _, _, over, held in results)
    assert sum(r[0] for r in results) > 0 and sum(r[1] for r in results) > 0  # contended
    assert ledger.free() == 4
    ledger.release(CAPACITY - 4)
    assert ledger.free() == CAPACITY and [h.name for h in ledger.holders()] == ["gateway-probe"]


def test_a_request_that_cannot_be_met_changes_nothing(tmp_path):
    ledger = PageLedger.create(tmp_path / "ledger", 10, 4096)
    ledger.join("a")
    assert ledger.try_acquire(7)
    assert not ledger.try_acquire(4)  # 3 are left: nothing is taken
    assert ledger.held() == 7 and ledger.free() == 3
    with pytest.raises(LedgerError, match="releasing 8 pages, this worker holds 7"):
        ledger.release(8)


def _hold_and_die(path: str) -> None:
    ledger = PageLedger(path)
    ledger.join("crashes")
    ledger.try_acquire(10)
    os._exit(0)  # no leave(): its row still says 10 pages


@pytest.mark.e2e
def test_the_pages_of_a_worker_that_died_go_back(tmp_path):
    path = tmp_path / "ledger"
    ledger = PageLedger.create(path, 10, 4096)
    p = mp.Process(target=_hold_and_die, args=(str(path),))
    p.start()
    p.join(timeout=30)
    # Its pages go back as soon as anyone looks: the gateway places and evicts by free().
    assert ledger.free() == 10 and ledger.holders() == []
    ledger.join("b")
    assert ledger.try_acquire(10)
    assert [(h.name, h.pages) for h in ledger.holders()] == [("b", 10)]


def test_files_that_are_not_ledgers_are_refused(tmp_path):
    with pytest.raises(LedgerError, match="no page ledger here"):
        PageLedger(tmp_path / "missing")
    (tmp_path / "junk").write_bytes(b"x" * 100)
    with pytest.raises(LedgerError, match="100 bytes is not a page ledger"):
        PageLedger(tmp_path / "junk")
    ledger = PageLedger.create(tmp_path / "l", 1, 1)
    with pytest.raises(LedgerError, match="join the ledger"):
        ledger.try_acquire(1)
