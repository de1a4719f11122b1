"""Weaver in the engine, two processes on simcuda with tiny random models: a hot engine offloads
part of its decode batch's attention (with those sequences' KV) to a cold engine that serves its
own requests meanwhile. The hot engine's greedy tokens equal an engine's without offload, the cold
engine's tokens are unchanged, and a receiver killed mid-decode costs a recompute, never a hang."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from gguf import GGMLQuantizationType as T

from medusa import plugins
from medusa.engine.config import EngineConfig
from medusa.engine.device import Device
from medusa.engine.llm_engine import LLMEngine, StepOutput
from medusa.engine.sampling import SamplingParams
from medusa.engine.sequence import Sequence
from medusa.prism.ledger import PageLedger
from medusa.weaver.cold import ColdWeaving
from medusa.weaver.hot import HotWeaving, hot_weaving, pair, unpair
from medusa.weaver.offload import WeavingLink
from medusa.weaver.receiver import WeaverReceiver
from medusa.weaver.region import RECEIVER_PID, ExchangeRegion, Geometry
from tests.engine.tiny_models import write_gguf
from tests.weaver.cold_engine import cold_config, generate

HERE = Path(__file__).parent
PROMPTS = [[(7 * i + j) % 250 + 1 for j in range(3 + 2 * i)] for i in range(8)]
TOKENS = 10


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    d = tmp_path_factory.mktemp("weaving")
    write_gguf(d / "hot.gguf", [T.F32], seed=0)
    write_gguf(d / "cold.gguf", [T.F32], seed=1)
    return str(d / "hot.gguf"), str(d / "cold.gguf")


def hot_config(model: str) -> EngineConfig:
    return EngineConfig(model=model, max_num_seqs=8, max_model_len=128,
                        max_num_batched_tokens=128, kv_cache_memory=4 << 20)  # fmt: skip


def run(engine: LLMEngine, on_step=None, logits=None) -> list[list[int]]:  # type: ignore[no-untyped-def]
    """Greedy completions of PROMPTS; `logits` (a list) gets each step's logits, as bytes."""
    params = SamplingParams(max_tokens=TOKENS, ignore_eos=True)
    seqs = [engine.add_request(p, params) for p in PROMPTS]
    steps = 0
    while engine.has_unfinished():
        outs: list[StepOutput] = engine.step()
        steps += 1
        if logits is not None and outs:
            logits.append(engine.runner.last_logits(len(outs)).tobytes())
        if on_step is not None:
            on_step(steps, outs)
    return [s.completion_ids for s in seqs]


@pytest.fixture(scope="module")
def expected(models: tuple[str, str]) -> tuple[list[list[int]], list[list[int]], list[bytes]]:
    """The hot model's tokens without offload, the cold model's serving alone, and the hot
    model's logits of each step."""
    logits: list[bytes] = []
    with LLMEngine(hot_config(models[0])) as hot:
        want_hot = run(hot, logits=logits)
    with LLMEngine(cold_config(models[1])) as cold:
        want_cold = generate(cold, None)
    return want_hot, want_cold, logits


def start_cold(
    region: Path, model: str, *flags: str, env: dict[str, str] | None = None
) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(HERE / "cold_engine.py"), str(region), model, *flags],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": str(HERE.parents[1]), **(env or {})},
    )  # fmt: skip


def paired(config: EngineConfig, link: WeavingLink) -> LLMEngine:
    pair(hot := LLMEngine(config), link)
    return hot


def woven(hot: LLMEngine) -> HotWeaving:
    assert (w := hot_weaving(hot)) is not None, "the hot engine is not paired"
    return w


def wait_for_receiver(hot: LLMEngine, proc: subprocess.Popen[str] | None) -> None:
    deadline = time.monotonic() + 60
    while woven(hot).region.counter(RECEIVER_PID) == 0:
        assert proc is None or proc.poll() is None, "the cold engine exited before serving"
        assert time.monotonic() < deadline, "the cold engine did not start serving in 60 s"
        time.sleep(0.05)


@pytest.mark.e2e
@pytest.mark.parametrize("ratio", [0.0, 0.45, 1.0])
def test_hot_tokens_equal_no_offload_and_cold_tokens_unchanged(shm_path, models, expected, ratio):
    hot_model, cold_model = models
    region = shm_path / "weaver"
    hot = paired(hot_config(hot_model), WeavingLink(region, ratio, timeout=10.0))
    proc = start_cold(region, cold_model)
    try:
        wait_for_receiver(hot, proc)
        logits: list[bytes] = []
        got = run(hot, logits=logits)
        w = woven(hot)
        assert w.error is None
        assert w.num_offloaded == int(len(PROMPTS) * ratio)
        assert bool(hot.runner.segments) == (ratio > 0)  # woven steps replayed graph segments
        hot.shutdown()  # releases what the receiver holds and stops the pairing
        out, _ = proc.communicate(timeout=60)
    finally:
        proc.kill()
        proc.wait()
    want_hot, want_cold, want_logits = expected
    assert got == want_hot
    differ = [i for i, (a, b) in enumerate(zip(logits, want_logits, strict=True)) if a != b]
    assert not differ, f"logits differ at steps {differ}"  # bit for bit, not just the argmax
    cold = json.loads(out)
    assert cold["tokens"] == want_cold
    assert (cold["served"] > 1) == (ratio > 0)  # tasks served, the final STOP included


@pytest.mark.e2e
def test_a_receiver_killed_mid_decode_costs_a_recompute_not_a_hang(shm_path, models, expected):
    hot_model, cold_model = models
    region = shm_path / "weaver"
    hot = paired(hot_config(hot_model), WeavingLink(region, 0.45, timeout=10.0))
    proc = start_cold(region, cold_model)
    times: list[float] = []

    def kill_after_decoding(step: int, outs: list[StepOutput]) -> None:
        times.append(time.monotonic())
        if step == 4:
            proc.kill()
            proc.wait()

    try:
        wait_for_receiver(hot, proc)
        got = run(hot, kill_after_decoding)
        w = woven(hot)
        assert w.error is not None
        assert "exited" in w.error and "must be recomputed" in w.error
        assert w.num_recomputed == w.num_offloaded == 3
        assert (
            max(b - a for a, b in zip(times, times[1:], strict=False)) < 5
        )  # no step waited for long
    finally:
        proc.kill()
        proc.wait()
        hot.shutdown()
    assert got == expected[0]


def test_until_a_receiver_opens_the_region_nothing_is_offloaded(shm_path, models, expected):
    with LLMEngine(hot_config(models[0])) as hot:
        pair(hot, WeavingLink(shm_path / "weaver", 1.0, timeout=0.5))
        assert run(hot) == expected[0]
        w = woven(hot)
        assert w.num_prefilled == len(PROMPTS)
        assert w.num_offloaded == 0 and w.error is None
        t0 = time.monotonic()
        unpair(hot)  # no receiver to stop: no wait for one
        assert time.monotonic() - t0 < 0.5 and not (shm_path / "weaver").exists()


@pytest.mark.e2e
def test_unpairing_mid_decode_brings_the_kv_back_and_nothing_changes(shm_path, models, expected):
    """The cold model gets busy: the hot engine takes its sequences' KV back between two steps
    and decodes them locally from there, bit for bit as if they had never left."""
    hot_model, cold_model = models
    region = shm_path / "weaver"
    hot = paired(hot_config(hot_model), WeavingLink(region, 1.0, timeout=10.0))
    proc = start_cold(region, cold_model)
    pairing = [hot_weaving(hot)]

    def unpair_after_decoding(step: int, outs: list[StepOutput]) -> None:
        if step == 4:
            unpair(hot)
            assert not region.exists()

    try:
        wait_for_receiver(hot, proc)
        logits: list[bytes] = []
        got = run(hot, unpair_after_decoding, logits)
        w = pairing[0]
        assert w is not None and hot_weaving(hot) is None and w.error is None and w.unpaired
        assert w.num_taken_back == w.num_offloaded == len(PROMPTS) and w.num_recomputed == 0
        out, _ = proc.communicate(timeout=60)  # unpair stopped the receiver: the cold one ends
    finally:
        proc.kill()
        proc.wait()
        hot.shutdown()
    assert got == expected[0] and logits == expected[2]
    assert json.loads(out)["tokens"] == expected[1]


def test_a_receiver_lost_while_releasing_an_aborted_sequence(shm_path, models, expected):
    """An offloaded sequence is aborted between steps and the receiver stops polling: the release
    before the next decode step finds it lost, and the other offloaded sequences are recomputed."""
    region = shm_path / "weaver"
    hot = paired(hot_config(models[0]), WeavingLink(region, 1.0, timeout=1.0))
    polling = threading.Event()
    polling.set()

    def receive() -> None:  # a receiver in a thread of this process, with a device of its own
        rec = WeaverReceiver(ExchangeRegion(region), Device(), 96, 4)
        while polling.is_set():
            rec.poll()
            time.sleep(1e-4)
        rec.close()  # NOTE: its host registration would outlive the mapping, and a region that
        rec.region.close()  # a later test maps at the same address could not be registered

    thread = threading.Thread(target=receive, daemon=True)
    thread.start()
    aborted: list[Sequence] = []

    def abort_one(step: int, outs: list[StepOutput]) -> None:
        if step == 3:
            aborted.append(outs[0].seq)
            hot.abort(outs[0].seq)
            polling.clear()
            thread.join()

    try:
        wait_for_receiver(hot, None)
        got = run(hot, abort_one)
        w = woven(hot)
        assert w.error is not None and "has not polled" in w.error
        assert w.num_recomputed == len(PROMPTS) - 1
    finally:
        hot.shutdown()
    i = PROMPTS.index(aborted[0].token_ids[: aborted[0].num_prompt_tokens])
    assert got[:i] + got[i + 1 :] == expected[0][:i] + expected[0][i + 1 :]


def weaver_pages(ledger: PageLedger) -> int | None:
    """Pages on the receivers' rows of the ledger (None: no such row)."""
    rows = [h.pages for h in ledger.holders() if h.name.endswith(":weaver")]
    return sum(rows) if rows else None


@pytest.mark.e2e
def test_a_receiver_on_elastic_kv_draws_ledger_pages_and_gives_them_back(
    tmp_path, shm_path, models, expected
):
    """The cold engine's KV is elastic: the offloaded sequences' blocks are pages of the device's
    ledger (on the cold worker's `:weaver` row) while they live, and go back as they finish; the
    pairing's end gives the row back. The hot logits stay bit-identical."""
    ledger = PageLedger.create(tmp_path / "ledger", 64, 2 << 20)
    region = shm_path / "weaver"
    hot = paired(hot_config(models[0]), WeavingLink(region, 1.0, timeout=10.0))
    proc = start_cold(region, models[1], "--elastic", "--hold",
                      env={"MEDUSA_KV_LEDGER": str(ledger.path)})  # fmt: skip
    pages: list[int | None] = []
    try:
        wait_for_receiver(hot, proc)
        logits: list[bytes] = []
        got = run(hot, lambda step, outs: pages.append(weaver_pages(ledger)), logits)
        assert woven(hot).error is None and woven(hot).num_offloaded == len(PROMPTS)
        assert max(p or 0 for p in pages) >= 1  # held while the sequences decode there
        assert weaver_pages(ledger) == 0  # all finished: their pages went back, still paired
        unpair(hot)
        assert proc.stdout is not None
        cold = json.loads(proc.stdout.readline())  # the cold engine closed its receiver
        assert weaver_pages(ledger) is None  # the row is gone with the pairing
        assert ledger.free() == ledger.capacity - sum(h.pages for h in ledger.holders())
        proc.communicate("\n", timeout=60)
    finally:
        proc.kill()
        proc.wait()
        hot.shutdown()
    assert got == expected[0] and logits == expected[2]
    assert cold["tokens"] == expected[1]


def test_an_elastic_receiver_with_no_pages_free_refuses(tmp_path, shm_path, models, monkeypatch):
    ledger = PageLedger.create(tmp_path / "ledger", 8, 2 << 20)
    monkeypatch.setenv("MEDUSA_KV_LEDGER", str(ledger.path))
    region = ExchangeRegion.create(shm_path / "weaver", Geometry(2, 4, 2, 64, 8, 128))
    plugins.register()  # kv_memory="elastic"
    with LLMEngine(cold_config(models[1], "elastic")) as cold:
        hog = PageLedger(ledger.path)
        hog.join("another model")
        assert hog.try_acquire(ledger.free())
        with pytest.raises(MemoryError, match=r"page ledger .* has 0 of 8 pages free; holding one"):
            ColdWeaving(cold, region.path, 96, block_size=4)
        hog.release(hog.held())
        weaving = ColdWeaving(cold, region.path, 96, block_size=4)  # pages free: it pairs
        weaving.close()
        assert weaver_pages(ledger) is None
    region.close()
