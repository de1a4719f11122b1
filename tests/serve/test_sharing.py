"""Elastic slices in the gateway (Prism): two models' workers share one simulated slice and its page
ledger, placement goes by KV pressure and evicts idle models only when memory is short, and one
Moore-Hodgson queue per slice decides which waiting request goes next."""

from __future__ import annotations

import asyncio
import concurrent.futures
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
from gguf import GGMLQuantizationType as T

from medusa.cli import run
from medusa.prism.ledger import PageLedger
from medusa.prism.schedule import Job, moore_hodgson
from medusa.serve.gateway.admission import RateMeter, SliceQueue, prompt_tokens
from medusa.serve.gateway.config import ConfigError, GatewayConfig, ModelConfig, load_config
from medusa.serve.gateway.placement import check_placement
from medusa.serve.gateway.sharing import PAGE_BYTES, Sharing
from medusa.serve.gateway.slices import Slice, simulated_slices
from medusa.serve.prepared import Assignment
from tests.engine.tiny_models import write_gguf
from tests.serve.test_gateway import _start_gateway
from tests.serve.test_pool import _pool

# ---- the slice's queue -------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_slice_queue_admits_in_moore_hodgson_order_and_serves_the_late_last():
    # (name, slo_ttft, prompt tokens) at 100 tokens/s, all arriving at 0 while one runs until 1.
    reqs = [("long", 2.6, 150), ("a", 2.0, 50), ("b", 3.0, 100), ("c", 3.5, 100), ("d", 9, 10)]
    clock = Clock()
    q = SliceQueue(prefill_speed=100, concurrency=1, clock=clock)
    order: list[str] = []

    async def go() -> None:
        await q.admit(1.0, 100)  # the one running

        async def one(name: str, slo: float, tokens: int) -> None:
            await q.admit(slo, tokens)
            order.append(name)

        tasks = [asyncio.create_task(one(*r)) for r in reqs]
        await asyncio.sleep(0)
        clock.now = 1.0
        q.done()  # the running one ends: the queue picks
        while len(order) < len(reqs):
            await asyncio.sleep(0)
            ran = next(r for r in reqs if r[0] == order[-1])
            clock.now += ran[2] / 100
            q.done()
            await asyncio.sleep(0)
        await asyncio.gather(*tasks)

    asyncio.run(go())
    jobs = [Job(slo, tokens / 100, name) for name, slo, tokens in reqs]
    on_time, late = moore_hodgson(jobs, 1.0)
    # Earliest deadline first would run "long" second and make it, b and c late; Moore-Hodgson
    # serves "long" (the longest) last and only it misses.
    assert order == [j.key for j in on_time + late] == ["a", "b", "c", "d", "long"]
    assert q.running == 1 and len(q) == 0  # the last one admitted runs


def test_a_request_whose_client_leaves_gives_up_its_place():
    q = SliceQueue(prefill_speed=100, concurrency=1)

    async def go() -> None:
        await q.admit(1.0, 10)
        waiter = asyncio.create_task(q.admit(1.0, 10))
        await asyncio.sleep(0)
        assert len(q) == 1
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        assert len(q) == 0 and len(q.queue) == 0
        q.done()
        assert q.running == 0

    asyncio.run(go())


def test_rates_count_the_window_and_prompts_are_estimated_without_a_tokenizer():
    clock = Clock()
    rates = RateMeter(10.0, clock)
    for t in (0.0, 1.0, 2.0, 12.5):
        clock.now = t
        rates.arrived("a")
    assert rates.rate("a") == pytest.approx(0.1) and rates.rate("b") == 0.0
    assert prompt_tokens({"prompt": [1, 2, 3]}) == 3
    assert prompt_tokens({"prompt": "x" * 400}) == 101
    assert prompt_tokens({"messages": [{"role": "user", "content": "y" * 40}]}) == 11


# ---- placement ---------------------------------------------------------------------------


@dataclass
class Worker:
    model: str
    slice: Slice
    inflight: int = 0
    pid: int = 0
    state: object = field(default_factory=lambda: type("S", (), {"value": "warm"})())

    @property
    def proc(self) -> Worker:
        return self


def _sharing(tmp_path: Path, slices: list[Slice], **slos: float) -> Sharing:
    models = {m: ModelConfig(m, slo_ttft=slo) for m, slo in slos.items()}
    config = GatewayConfig(models, sharing={"*": "elastic"})
    sizes = dict.fromkeys(slos, (20 * PAGE_BYTES, 2 * PAGE_BYTES))  # weights, one sequence's KV
    return Sharing(config, slices, ledger_dir=tmp_path, footprints=sizes)


def _kv(s: Slice, pages: int) -> PageLedger:
    """A worker on `s` holding `pages` KV pages."""
    ledger = PageLedger(s.env["MEDUSA_KV_LEDGER"])
    ledger.join("kv")
    assert ledger.try_acquire(pages)
    return ledger


def test_a_model_goes_to_the_lowest_kv_pressure_and_evicts_no_one_where_room_is(tmp_path):
    slices = [Slice("s0", 100 * PAGE_BYTES, 16), Slice("s1", 100 * PAGE_BYTES, 16)]
    sharing = _sharing(tmp_path, slices, a=0.5, b=4.0, c=1.0)
    assert all(s.shared and "MEDUSA_KV_LEDGER" in s.env for s in slices)
    for _ in range(20):
        sharing.rates.arrived("a")  # a is hot
    sharing.rates.arrived("b")
    live = [Worker("a", slices[0])]
    assert sharing.reserve(slices[0], "a")
    choice = sharing.choose("b", live, {})
    assert choice is not None and choice.slice is slices[1] and not choice.evict
    assert sharing.reserve(slices[1], "b")
    live.append(Worker("b", slices[1]))
    _kv(slices[1], 60)  # s1 now has 20 pages free: c (22 with one sequence's KV) needs more
    choice = sharing.choose("c", live, {})
    assert choice is not None and choice.slice is slices[0] and not choice.evict
    assert sharing.choose("a", live, {}).slice is slices[1]  # a second a: not where one is
    paths = [Path(s.env["MEDUSA_KV_LEDGER"]) for s in slices]
    sharing.close()
    assert not any(p.exists() for p in paths)  # the ledgers go at shutdown


def test_only_a_short_slice_evicts_idle_models_larger_slo_first(tmp_path):
    s0 = Slice("s0", 100 * PAGE_BYTES, 16)
    sharing = _sharing(tmp_path, [s0], a=0.5, b=4.0, c=1.0, d=1.0, e=1.0)
    live = [Worker("a", s0, inflight=1), Worker("b", s0), Worker("c", s0)]
    for w in live:
        assert sharing.reserve(s0, w.model)
    kv = _kv(s0, 30)  # 10 pages free: d needs 22
    choice = sharing.choose("d", live, {})
    assert choice is not None and [w.model for w in choice.evict] == ["b"]  # not c, never busy a
    retired: list[str] = []

    def retire(w: Worker) -> None:
        retired.append(w.model)
        sharing.release(w.slice, w.model)

    assert sharing.make_room("d", choice, retire) and retired == ["b"]
    live = [live[0], live[2], Worker("d", s0, inflight=1)]
    assert sharing.choose("e", live, {"c": 1}) is None  # c has a request waiting: not idle
    kv.release(30)
    choice = sharing.choose("e", live, {"c": 1})
    assert choice is not None and not choice.evict  # room again: nobody goes
    sharing.close()


def test_slices_that_join_get_a_ledger_and_lost_ones_take_theirs_with_them(tmp_path):
    """The back-end's slice list changes (Ray nodes join and go): elastic slices follow it, each
    ledger made by the back-end's `open_ledger` (here files in tmp_path, as the local one)."""
    s0, s1 = Slice("s0", 100 * PAGE_BYTES, 16), Slice("s1", 100 * PAGE_BYTES, 16)
    slices = [s0]
    sharing = _sharing(tmp_path, slices, a=1.0, b=1.0)
    assert sharing.reserve(s0, "a")
    slices.append(s1)  # a node joined
    sharing.follow(slices)
    assert s1.shared and sharing.ledgers["s1"].free() == 100
    assert sharing.choose("b", [Worker("a", s0)], {}).slice is s1  # the empty one
    lost = Path(s0.env["MEDUSA_KV_LEDGER"])
    slices.remove(s0)  # its node was lost, and a's worker with it
    sharing.follow(slices)
    assert "s0" not in sharing.ledgers and sharing.slices == [s1] and not lost.exists()
    sharing.release(s0, "a")  # a's worker is retired later: nothing left to give back
    assert sharing.choose("a", [], {}).slice is s1
    sharing.close()
    assert not Path(s1.env["MEDUSA_KV_LEDGER"]).exists() and not lost.exists()


def test_sharing_config_errors_name_the_field_and_the_fix(tmp_path):
    (tmp_path / "slices.yaml").write_text("slices:\n  - {name: s0, profile: 1g.24gb}\n")

    def check(text: str, *needles: str) -> None:
        (tmp_path / "models.yaml").write_text(text)
        with pytest.raises(ConfigError) as e:
            check_placement(
                load_config(tmp_path / "models.yaml"), simulated_slices(tmp_path / "slices.yaml")
            )
        for n in needles:
            assert n in str(e.value), str(e.value)

    check("models:\n  a: {slo_ttft: 0}\n", "models.a.slo_ttft", "seconds > 0", "slo_ttft: 2.0")
    check("models:\n  a: {slo_tpot: fast}\n", "models.a.slo_tpot", "'fast'")
    check("models:\n  a: {}\nsharing: shared\n", "sharing", "'elastic'", "'static'")
    check(
        "models:\n  a: {}\nsharing: {2g.24gb: elastic}\nslices: slices.yaml\n",
        "sharing.2g.24gb",
        "1g.24gb",
    )
    check("models:\n  a: {}\nprism: {concurrency: 0}\n", "prism.concurrency", ">= 1")
    check("models:\n  a: {}\nprism: {speed: 3}\n", "prism", "prefill_speed")
    (tmp_path / "models.yaml").write_text(
        "models:\n  a: {slo_ttft: 0.5, slo_tpot: 0.05}\nsharing: {1g.24gb: elastic}\n"
        "prism: {prefill_speed: 4000, concurrency: 2}\nslices: slices.yaml\n"
    )
    config = load_config(tmp_path / "models.yaml")
    assert config.models["a"].slo_ttft == 0.5 and config.sharing_of("1g.24gb") == "elastic"
    assert config.sharing_of("7g.96gb") == "static" and config.prism.concurrency == 2


def test_a_pooled_worker_is_assigned_elastic_kv():
    job = Assignment(run, ["m.gguf", "--kv-memory", "elastic", "--served-model-name", "a"])
    assert job.config.kv_memory == "elastic"


# ---- the gateway -------------------------------------------------------------------------

ENGINE = "{max_model_len: 256, max_num_seqs: 4, max_num_batched_tokens: 256, enforce_eager: true}"


def _pages(base: str) -> dict[str, float]:
    """medusa_prism_pages_held on slice s0, by model."""
    out = {}
    for line in httpx.get(f"{base}/metrics").text.splitlines():
        if line.startswith("medusa_prism_pages_held{") and 'slice="s0"' in line:
            out[line.split('model="')[1].split('"')[0]] = float(line.split()[-1])
    return out


@pytest.mark.e2e
def test_two_models_share_one_elastic_slice_and_its_ledger(tmp_path):
    """One worker comes from the warm pool, the other is started: both run elastic KV."""
    for name, seed in (("a", 1), ("b", 2)):  # 8 layers, 4 KV heads: 256 KiB blocks, 8 a page
        write_gguf(tmp_path / f"{name}.gguf", [T.F32], seed=seed, dims={"layers": 8, "kv_heads": 4})
    (tmp_path / "slices.yaml").write_text("slices:\n  - {name: s0, memory_gb: 1}\n")
    (tmp_path / "models.yaml").write_text(
        f"models:\n  a: {{model: {tmp_path}/a.gguf, slo_ttft: 0.5, engine: {ENGINE}}}\n"
        f"  b: {{model: {tmp_path}/b.gguf, slo_ttft: 2, engine: {ENGINE}}}\n"
        "slices: slices.yaml\nsharing: elastic\nprism: {concurrency: 4}\nwarm_pool: 1\n"
    )
    proc, base = _start_gateway(str(tmp_path / "models.yaml"))
    try:
        (pooled,) = _pool(base, 1)  # a pooled worker waits on the elastic slice

        def ask(model: str, max_tokens: int) -> int:
            # greedy, and a prompt after which neither random model says its EOS for 230 tokens
            body = {"model": model, "prompt": "once upon a time", "max_tokens": max_tokens}
            r = httpx.post(f"{base}/v1/completions", json={**body, "temperature": 0}, timeout=60)
            assert r.status_code == 200, r.text
            return int(r.json()["usage"]["completion_tokens"])

        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            assert list(pool.map(ask, "ab", [4, 4])) == [4, 4]  # both start, on the one slice
            seen: dict[str, float] = {}
            done = [pool.submit(ask, m, 200) for m in "ab"]
            while not all(f.done() for f in done):
                pages = _pages(base)
                if pages.get("a", 0) > 0 and pages.get("b", 0) > 0:
                    seen = pages  # both workers hold pages of the one ledger at once
                time.sleep(0.02)
            assert [f.result() for f in done] == [200, 200]
        insts = httpx.get(f"{base}/admin/instances").json()
        assert [i["slice"] for m in "ab" for i in insts[m]] == ["s0", "s0"]
        assert pooled["pid"] in [i["pid"] for m in "ab" for i in insts[m]]  # one came from it
        assert seen, "never saw both models' pages at once"
        deadline = time.time() + 10
        while time.time() < deadline and any(_pages(base).values()):
            time.sleep(0.1)
        assert _pages(base) == {"a": 0, "b": 0}  # idle models gave their pages back
        assert [i["state"] for m in "ab" for i in insts[m]] == ["warm", "warm"]  # and stay
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    ledger = next(line for line in out.splitlines() if "page ledger" in line).split()[-1]
    assert not Path(ledger).exists(), out[-2000:]  # removed at shutdown


def test_a_model_migrates_only_when_its_kv_pressure_drops_by_more_than_the_threshold(tmp_path):
    s0, s1 = Slice("s0", 100 * PAGE_BYTES, 16), Slice("s1", 100 * PAGE_BYTES, 16)
    sharing = _sharing(tmp_path, [s0, s1], a=0.5, b=0.5)
    live = [Worker("a", s0), Worker("b", s0)]
    for w in live:
        assert sharing.reserve(s0, w.model)
    assert sharing.migration(live, now=0.0) is None  # no traffic: no pressure to lower
    for _ in range(20):
        sharing.rates.arrived("a")
        sharing.rates.arrived("b")
    move = sharing.migration(live, now=1.0)
    assert move is not None and move[1] is s1  # one of two equally hot models moves
    assert sharing.migration(live, now=2.0) is None  # just moved: the rates settle first
    moved = move[0].model
    live = [w for w in live if w.model != moved] + [Worker(moved, s1)]
    assert sharing.migration(live, now=60.0) is None  # settled: one hot model per slice
    kv = _kv(s1, 79)  # s1 full: a move there would have no room
    live = [Worker("a", s0), Worker("b", s0)]
    assert sharing.migration(live, now=120.0) is None
    kv.leave()
    sharing.close()


@pytest.mark.e2e
def test_the_gateway_migrates_a_model_to_a_slice_with_less_kv_pressure(tmp_path):
    # Three models on two elastic slices, each placed where KV pressure was lowest when it
    # started; then traffic shifts (short rate window) and Prism's placement moves one: a new
    # worker on the other slice, the old one drained once it serves. No request fails, and the
    # model ends with one worker, on the slice it moved to.
    for name, seed in (("a", 1), ("b", 2), ("c", 3)):
        write_gguf(tmp_path / f"{name}.gguf", [T.F32], seed=seed, dims={"layers": 8, "kv_heads": 4})
    (tmp_path / "slices.yaml").write_text(
        "slices:\n  - {name: s0, memory_gb: 1}\n  - {name: s1, memory_gb: 1}\n"
    )
    models = "".join(f"  {m}: {{model: {tmp_path}/{m}.gguf, engine: {ENGINE}}}\n" for m in "abc")
    (tmp_path / "models.yaml").write_text(
        f"models:\n{models}slices: slices.yaml\nsharing: elastic\nprism: {{rate_window: 3}}\n"
    )
    proc, base = _start_gateway(str(tmp_path / "models.yaml"))
    seen: dict[str, set[str]] = {m: set() for m in "abc"}
    try:

        def ask(model: str) -> int:
            body = {"model": model, "prompt": "once upon a time", "max_tokens": 2}
            r = httpx.post(f"{base}/v1/completions", json={**body, "temperature": 0}, timeout=60)
            return r.status_code

        def where() -> dict[str, list[str]]:
            insts = httpx.get(f"{base}/admin/instances").json()
            return {m: [i["slice"] for i in insts[m]] for m in "abc"}

        codes = [ask(m) for m in "abc"]
        deadline = time.time() + 30
        start = where()
        while any(len(s) != 1 for s in start.values()) and time.time() < deadline:
            time.sleep(0.2)  # (a move the first rates already called for, finished)
            start = where()
        # Three models, two slices: two share one. They get all the traffic, the third idles.
        pairs = [[x, y] for x in "abc" for y in "abc" if x < y and start[x] == start[y]]
        assert pairs, start
        hot = pairs[0]
        for m in "abc":
            seen[m] |= set(start[m])
        moved, deadline = None, time.time() + 60
        while moved is None and time.time() < deadline:
            codes += [ask(m) for m in hot]
            now = where()
            for m in hot:
                seen[m] |= set(now[m])
                if len(seen[m]) == 2 and len(now[m]) == 1:
                    moved = (m, now[m][0])
        assert moved is not None, seen
        assert set(codes) == {200}
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    model, to = moved
    assert f"migrating {model} from " in out and f" to {to} (lower KV pressure)" in out, out[-3000:]
