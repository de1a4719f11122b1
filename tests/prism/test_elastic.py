"""Elastic KV on simcuda: pages are mapped under live blocks and unmapped when they empty, the
device's ledger holds exactly the pages a worker has, a worker that cannot get a page is told so
(never crashes, never keeps half a request's pages), and an idle model's pages go to a busy one."""

from __future__ import annotations

import random

import pytest

from medusa.cuda import CudaError, load_backend
from medusa.engine.sampling import SamplingParams
from medusa.engine.sequence import Sequence
from medusa.prism.blocks import ElasticBlockManager
from medusa.prism.ledger import PageLedger
from medusa.prism.pages import PagePool
from medusa.prism.vmm import Vmm

BLOCK = 737_280  # SmolLM2's block (16 tokens, 30 layers, K and V): blocks straddle 2 MiB pages


@pytest.fixture(scope="module")
def vmm():
    return Vmm(load_backend("sim"))


def worker(vmm, path, name, pages=8):
    ledger = PageLedger(path)
    ledger.join(name)
    return ElasticBlockManager(PagePool(vmm, pages, ledger=ledger, spare=1), 16, BLOCK), ledger


def seq(tokens):
    return Sequence(list(range(tokens)), SamplingParams(), 0)


def check(mgr, ledger, vmm):
    live = mgr.pages_of([b for s in mgr.live for b in s.block_table])
    assert ledger.held() == mgr.pool.num_held == len(live) + mgr.pool.num_spare
    assert mgr.pool.num_mapped == mgr.pages_in_use() == len(live)  # nothing mapped ahead
    b = vmm.b
    for s in mgr.live:
        for blk in s.block_table:  # every live block is device memory the kernels can write
            b.memset(mgr.pool.base + blk * mgr.block_bytes, 0, mgr.block_bytes)


def test_pages_follow_live_blocks_and_the_ledger_follows_pages(vmm, tmp_path):
    path = tmp_path / "ledger"
    PageLedger.create(path, 6, vmm.granularity)
    mgr, ledger = worker(vmm, path, "a")
    mgr.live = []
    rng = random.Random(3)
    for _ in range(120):
        if mgr.live and rng.random() < 0.4:
            mgr.deallocate(mgr.live.pop(rng.randrange(len(mgr.live))))
        elif mgr.live and rng.random() < 0.5:
            s = rng.choice(mgr.live)
            s.token_ids.append(0)
            if mgr.can_append(s):
                mgr.may_append(s)
            else:
                s.token_ids.pop()
        else:
            s = seq(rng.randint(1, 60))
            if mgr.can_allocate(s):
                mgr.allocate(s)
                mgr.live.append(s)
        check(mgr, ledger, vmm)
    for s in mgr.live:
        mgr.deallocate(s)
    mgr.live = []
    mgr.trim()
    assert mgr.pool.num_mapped == mgr.pages_in_use() == 0 and ledger.held() == 0
    with pytest.raises(CudaError):  # unmapped again: the device faults on it
        vmm.b.memset(mgr.pool.base, 0, 16)


def test_a_request_the_budget_cannot_hold_takes_nothing(vmm, tmp_path):
    path = tmp_path / "ledger"
    PageLedger.create(path, 2, vmm.granularity)
    mgr, ledger = worker(vmm, path, "a")
    big = seq(16 * 6)  # 6 blocks: 4.2 MiB, three pages
    assert not mgr.can_allocate(big)
    assert ledger.held() == mgr.pool.num_held <= 1 and mgr.pages_in_use() == 0
    small = seq(16 * 2)
    assert mgr.can_allocate(small)
    mgr.allocate(small)
    assert mgr.pages_in_use() == 1


def test_an_idle_models_pages_go_to_a_busy_one(vmm, tmp_path):
    path = tmp_path / "ledger"
    PageLedger.create(path, 8, vmm.granularity)
    a, la = worker(vmm, path, "a")
    b, lb = worker(vmm, path, "b")
    held_a = []
    while a.can_allocate(s := seq(16 * 2)) and la.held() < 4:
        a.allocate(s)
        held_a.append(s)
    grown = []
    while b.can_allocate(s := seq(16 * 2)):
        b.allocate(s)
        grown.append(s)
    assert lb.held() <= 4  # a static half would stop here; a holds the other half
    for s in held_a:  # a goes idle: its pages go back at once
        a.deallocate(s)
    a.trim()
    assert la.held() == 0
    while b.can_allocate(s := seq(16 * 2)):
        b.allocate(s)
        grown.append(s)
    assert lb.held() == 8 > 4 and b.pages_in_use() == 8


def test_blocks_larger_than_a_page_span_pages_and_the_range_holds_only_its_blocks(vmm, tmp_path):
    path = tmp_path / "ledger"
    PageLedger.create(path, 16, vmm.granularity)
    ledger = PageLedger(path)
    ledger.join("big")
    big = vmm.granularity * 3 // 2  # 1.5 pages: every block straddles, some touch three pages
    mgr = ElasticBlockManager(PagePool(vmm, 8, ledger=ledger, spare=0), 16, big, num_blocks=5)
    mgr.live = []
    assert mgr.num_blocks == 5
    for _ in range(5):
        s = seq(16)
        assert mgr.can_allocate(s)
        mgr.allocate(s)
        mgr.live.append(s)
        check(mgr, ledger, vmm)
    assert not mgr.can_allocate(seq(16))  # pages remain in the range, blocks do not
    check(mgr, ledger, vmm)
    for s in mgr.live[::2]:
        mgr.deallocate(s)
    mgr.live = mgr.live[1::2]
    check(mgr, ledger, vmm)
