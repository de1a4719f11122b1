"""Issue 30, finding 10: every row of the page ledger is checked as it is read. A row with pid 0
holding every page was never reclaimed (requests waited for pages forever, /health ok); pid 2^40
made os.kill raise and the gateway's /metrics answer 500. Now a row counts only while its holder
holds the lock on it (the kernel drops it when the holder dies), a free row must be all zeroes,
no signal is sent to a pid read from the file, and each holder rewrites its own row from its own
count: corrupt rows are reclaimed and requests keep being served."""

from __future__ import annotations

import multiprocessing as mp
import os
from pathlib import Path

import httpx
import pytest

from medusa.prism.ledger import HEADER, ROW, PageLedger
from medusa.serve.gateway.slice_ledger import FileLedger
from tests.security._shm import start_gateway, stop_gateway, wait_gateway
from tests.security.test_ledger_files import elastic_config, ledger_of

CORRUPT = [  # pid, pages, name: rows nobody holds, each claiming pages
    (0, 10**9, "pid 0 holds every page"),
    (2**40, 5, "pid past pid_max"),
    (1, 512, "init, alive, holds it all"),
    (-7, 3, "a negative pid"),
    (os.getpid(), -400, "negative pages"),
]


def corrupt(path: Path, first: int = 40) -> None:
    with open(path, "r+b") as f:
        for i, (pid, pages, name) in enumerate(CORRUPT):
            f.seek(HEADER.size + (first + i) * ROW.size)
            f.write(ROW.pack(pid, pages, name.encode()[:32]))


@pytest.mark.e2e
def test_a_corrupted_ledger_does_not_wedge_the_slice_or_the_metrics(tmp_path: Path) -> None:
    proc, base = start_gateway(elastic_config(tmp_path))
    try:
        wait_gateway(proc, base)
        corrupt(ledger_of(proc.pid))
        r = httpx.get(f"{base}/metrics", timeout=30)
        assert r.status_code == 200, r.text
        assert 'medusa_prism_ledger_pages{slice="s0",state="free"} 512.0' in r.text
        body = {"model": "tiny", "prompt": "once upon a time", "max_tokens": 8, "temperature": 0}
        r = httpx.post(f"{base}/v1/completions", json=body, timeout=120)
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] == 8
        corrupt(ledger_of(proc.pid), first=50)  # again, while its worker holds pages
        r = httpx.post(f"{base}/v1/completions", json=body, timeout=120)
        assert r.status_code == 200, r.text
        assert httpx.get(f"{base}/metrics", timeout=30).status_code == 200
        assert httpx.get(f"{base}/health", timeout=30).status_code == 200
    finally:
        stop_gateway(proc)


def _hold(path: str, pages: int, step: mp.Queue, told: mp.Queue) -> None:
    ledger = PageLedger(path)
    ledger.join("holder")
    assert ledger.try_acquire(pages)
    step.put("held")
    told.get(timeout=60)
    ledger.try_acquire(1)  # its next change: it writes its own count, whatever the file said
    step.put("changed")
    told.get(timeout=60)


@pytest.mark.e2e
def test_a_live_holders_corrupted_row_is_bounded_then_rewritten_by_its_holder(tmp_path):
    path = tmp_path / "ledger"
    ledger = PageLedger.create(path, 100, 4096)
    ctx = mp.get_context("spawn")
    step, told = ctx.Queue(), ctx.Queue()
    holder = ctx.Process(target=_hold, args=(str(path), 30, step, told))
    holder.start()
    try:
        assert step.get(timeout=60) == "held" and ledger.free() == 70
        [row] = [i for i in range(64) if ledger._read(i)[1] == 30]
        with open(path, "r+b") as f:  # its row says it holds more than the device has
            f.seek(HEADER.size + row * ROW.size)
            f.write(ROW.pack(holder.pid, 10**6, b"holder"))
        assert ledger.free() == 0 and [h.pages for h in ledger.holders()] == [100]
        told.put("change")
        assert step.get(timeout=60) == "changed"
        assert ledger.free() == 69 and [h.pages for h in ledger.holders()] == [31]
        told.put("exit")
        holder.join(60)
    finally:
        holder.kill()
    assert ledger.free() == 100 and ledger.holders() == []  # it exited: its row went with it


def test_the_gateways_own_rows_are_put_right_when_it_reads_the_ledger(tmp_path):
    ledger = FileLedger("s0", 100, 4096, tmp_path)
    assert ledger.hold("weights:tiny", 10) and ledger.free() == 90
    [row] = [i for i in range(64) if PageLedger(ledger.path)._read(i)[2] == "weights:tiny"]
    with open(ledger.path, "r+b") as f:  # the weights' row now says it holds every page
        f.seek(HEADER.size + row * ROW.size)
        f.write(ROW.pack(os.getpid(), 100, b"weights:tiny"))
    assert ledger.free() == 90  # put right before it was counted
    assert [(h.name, h.pages) for h in ledger.holders()] == [("weights:tiny", 10)]
    ledger.remove()
