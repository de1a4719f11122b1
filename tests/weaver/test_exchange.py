"""Offloaded attention through the exchange region, with a receiver in another process: the output
is bit-identical to the sender computing it itself, the cold worker's own output is unchanged, and
a receiver that dies or hangs ends in ReceiverLost naming the sequences, never a hang."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from medusa.engine.device import Device
from medusa.weaver.region import RECEIVER_PID, SENDER_PID, ExchangeRegion, Geometry
from medusa.weaver.sender import ReceiverLost, WeaverError, WeaverSender, assign_offload

HERE = Path(__file__).parent
GEO = Geometry(num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16, max_seqs=8, max_tokens=64)
BLOCK, BLOCKS, PROMPTS, DECODE = 4, 64, [5, 9, 3, 7, 4, 6, 8, 2], 4


class LocalAttention:
    """The sender's own attention for every sequence, with the engine's kernels and KV layout
    (blocks handed out back to front, so the layout differs from the receiver's)."""

    def __init__(self, dev: Device) -> None:
        self.dev = dev
        self.part = BLOCK * GEO.kv_size * 4  # block-major: [block][layer][k|v][slot][head][dim]
        self.stride = 2 * GEO.num_layers * self.part // 4
        self.kv = dev.alloc(BLOCKS * self.stride * 4)
        self.tables: dict[int, list[int]] = {}
        self.free = list(range(BLOCKS))
        self.ws = {n: dev.alloc(s) for n, s in (("q", 64 * GEO.q_size * 4),
                   ("k", 64 * GEO.kv_size * 4), ("v", 64 * GEO.kv_size * 4),
                   ("out", 64 * GEO.q_size * 4), ("slots", 256), ("bt", 8 * BLOCKS * 4),
                   ("lens", 64), ("qs", 64))}  # fmt: skip

    def attend(self, layer, ids, lens, q, k, v, qs):  # type: ignore[no-untyped-def]
        d, w = self.dev, self.ws
        slots, bt = [], np.zeros((len(ids), BLOCKS), np.int32)
        for i, (sid, total, q0, q1) in enumerate(zip(ids, lens, qs[:-1], qs[1:], strict=True)):
            t = self.tables.setdefault(sid, [])
            while len(t) * BLOCK < total:
                t.append(self.free.pop())
            bt[i, : len(t)] = t
            slots += [t[p // BLOCK] * BLOCK + p % BLOCK for p in range(total - (q1 - q0), total)]
        for name, arr in (("q", q), ("k", k), ("v", v), ("slots", np.int32(slots)), ("bt", bt),
                          ("lens", np.int32(lens)), ("qs", np.int32(qs))):  # fmt: skip
            d.upload(w[name], arr)
        kc = self.kv.ptr + 2 * layer * self.part
        vc = kc + self.part
        d.launch("reshape_and_cache_kernel", kc, vc, w["k"].ptr, w["v"].ptr, w["slots"].ptr,
                 len(q), GEO.num_kv_heads, GEO.head_dim, GEO.kv_size, BLOCK,
                 self.stride)  # fmt: skip
        d.launch("paged_attention_kernel", w["out"].ptr, w["q"].ptr, kc, vc, w["bt"].ptr,
                 w["lens"].ptr, w["qs"].ptr, len(ids), GEO.num_heads, GEO.num_kv_heads,
                 GEO.head_dim, BLOCK, BLOCKS, GEO.q_size, GEO.head_dim**-0.5,
                 self.stride)  # fmt: skip
        d.synchronize()
        return d.download(w["out"], np.float32, len(q) * GEO.q_size).reshape(len(q), GEO.q_size)


@pytest.fixture(scope="module")
def dev() -> Device:
    return Device()


def start_receiver(path: Path, steps: int = 50) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(HERE / "cold_worker.py"), str(path), "--steps", str(steps),
         "--blocks", str(BLOCKS), "--block-size", str(BLOCK)],  # fmt: skip
        stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(HERE.parents[1])},
    )  # fmt: skip


def wait_for_receiver(region: ExchangeRegion, proc: subprocess.Popen[str]) -> None:
    """Until the receiver serves: one that died starting fails here at once, with its stderr in
    the test's output (the sender would only see its silence, after its timeout)."""
    deadline = time.monotonic() + 60
    while region.counter(RECEIVER_PID) == 0:
        assert proc.poll() is None, f"the receiver exited ({proc.returncode}) before serving"
        assert time.monotonic() < deadline, "the receiver did not start serving in 60 s"
        time.sleep(0.02)


def rows(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return (rng.standard_normal((n, GEO.q_size), np.float32),
            rng.standard_normal((n, GEO.kv_size), np.float32),
            rng.standard_normal((n, GEO.kv_size), np.float32))  # fmt: skip


def run_batch(local: LocalAttention, sender: WeaverSender | None, ratio: float) -> int:
    """A prefill of PROMPTS then DECODE steps through every layer; the offloaded sequences' rows
    go to the receiver and must equal the local result bit for bit. Returns rows offloaded."""
    rng = np.random.default_rng(0)
    ids = list(range(100, 100 + len(PROMPTS)))
    off = set(assign_offload(ids, ratio))
    lens, checked = [0] * len(ids), 0
    for step in range(1 + DECODE):
        new = PROMPTS if step == 0 else [1] * len(ids)
        lens = [a + b for a, b in zip(lens, new, strict=True)]
        qs = np.concatenate([[0], np.cumsum(new)]).astype(int).tolist()
        for layer in range(GEO.num_layers):
            q, k, v = rows(rng, qs[-1])
            ref = local.attend(layer, ids, lens, q, k, v, qs)
            sel = [i for i, s in enumerate(ids) if s in off]
            if not sel or sender is None:
                continue
            r = np.concatenate([np.arange(qs[i], qs[i + 1]) for i in sel])
            sub_qs = np.concatenate([[0], np.cumsum([new[i] for i in sel])]).tolist()
            got = sender.attend(layer, [ids[i] for i in sel], [lens[i] for i in sel],
                                q[r], k[r], v[r], sub_qs)  # fmt: skip
            assert got.view(np.uint32).tobytes() == ref[r].view(np.uint32).tobytes()
            checked += len(r)
    return checked


@pytest.mark.e2e
@pytest.mark.parametrize("ratio", [0.0, 0.45, 1.0])
def test_offloaded_attention_is_bit_identical_and_cold_output_unchanged(shm_path, dev, ratio):
    region = ExchangeRegion.create(shm_path / "weaver", GEO)
    proc = start_receiver(shm_path / "weaver")
    try:
        wait_for_receiver(region, proc)
        sender = WeaverSender(region, timeout=20.0)
        checked = run_batch(LocalAttention(dev), sender, ratio)
        offloaded = assign_offload(list(range(8)), ratio)
        assert checked == sum((PROMPTS[i] + DECODE) * GEO.num_layers for i in offloaded)
        sender.release(sorted(sender.offloaded))
        assert not sender.offloaded
        sender.stop()
        out, _ = proc.communicate(timeout=60)
    finally:
        proc.kill()
    cold_digest, _served = out.split()
    ref = subprocess.run(
        [sys.executable, "-c", COLD_ALONE], capture_output=True, text=True, check=True,
        env={**os.environ, "PYTHONPATH": f"{HERE}:{HERE.parents[1]}"}, timeout=60,
    )  # fmt: skip
    assert cold_digest == ref.stdout.strip()


COLD_ALONE = """
from cold_worker import cold_model, digest
from medusa.engine.device import Device
dev = Device()
kernels, x = cold_model(dev)
for _ in range(50):
    for k in kernels:
        k()
print(digest(dev, x))
"""


def test_assignment_by_ratio_and_refusals(shm_path):
    ids = list(range(20))
    assert assign_offload(ids, 0.0) == [] and assign_offload(ids, 1.0) == ids
    assert len(assign_offload(ids, 0.45)) == 9
    with pytest.raises(ValueError, match="within"):
        assign_offload(ids, 1.5)
    region = ExchangeRegion.create(shm_path / "r", GEO)
    sender = WeaverSender(region, timeout=0.3)
    q, k, v = rows(np.random.default_rng(0), 65)
    with pytest.raises(ValueError, match="do not fit"):
        sender.attend(0, list(range(65)), [1] * 65, q, k, v)


@pytest.mark.e2e
@pytest.mark.parametrize("how", ["killed", "hung", "never started"])
def test_a_lost_receiver_is_detected_and_its_sequences_handed_back(shm_path, dev, how):
    region = ExchangeRegion.create(shm_path / "weaver", GEO)
    proc = None if how == "never started" else start_receiver(shm_path / "weaver", steps=0)
    try:
        if proc is not None:
            wait_for_receiver(region, proc)
        sender = WeaverSender(region, timeout=1.0 if how == "never started" else 10.0)
        q, k, v = rows(np.random.default_rng(1), 2)
        if proc is not None:
            sender.attend(0, [7, 9], [1, 1], q, k, v)  # the receiver now holds 7 and 9
            sender.timeout = 1.0
            os.kill(proc.pid, signal.SIGKILL if how == "killed" else signal.SIGSTOP)
        t0 = time.monotonic()
        with pytest.raises(ReceiverLost, match="must be recomputed") as e:
            sender.attend(1, [7, 9], [1, 1], q, k, v)
        assert time.monotonic() - t0 < 5
        assert e.value.seq_ids == [7, 9]
        assert ("exited" if how == "killed" else "has not polled") in str(e.value)
    finally:
        if proc is not None:
            proc.kill()
            proc.wait()


@pytest.mark.e2e
def test_receiver_errors_reach_the_sender_and_sequences_come_back(shm_path, dev):
    region = ExchangeRegion.create(shm_path / "weaver", GEO)
    proc = start_receiver(shm_path / "weaver", steps=0)
    try:
        wait_for_receiver(region, proc)
        sender = WeaverSender(region, timeout=20.0)
        rng = np.random.default_rng(2)
        q, k, v = rows(rng, 6)
        sender.attend(0, [1], [6], q, k, v, [0, 6])
        sender.attend(1, [1], [6], q, k[::-1].copy(), v, [0, 6])
        kb, vb = sender.take_back(1)
        assert kb.shape == (2, 6, GEO.kv_size)
        assert np.array_equal(kb[0], k) and np.array_equal(kb[1], k[::-1])
        assert np.array_equal(vb[0], v)
        assert not sender.offloaded
        q, k, v = rows(rng, 64)
        # rows that leave a gap (8 rows for 512 tokens): attention would read slots never written
        with pytest.raises(WeaverError, match="8 rows to reach 512 tokens, 0 held here"):
            sender.attend(0, list(range(8)), [8 * 64] * 8, q, k, v, list(range(0, 65, 8)))
        for n in (64, 128, 192, 256):  # sequence 3 takes all 64 blocks, 64 rows at a time
            for layer in range(GEO.num_layers):
                sender.append(layer, [3], [n], k, v, [0, 64])
        with pytest.raises(WeaverError, match="exceed this receiver"):
            sender.append(0, [3], [257], k[:1], v[:1], [0, 1])
        with pytest.raises(WeaverError, match="out of KV blocks"):
            sender.attend(0, [5], [1], q[:1], k[:1], v[:1])
        sender.release([3])
        q, k, v = rows(rng, 1)  # nothing was half taken: the receiver still serves
        assert sender.attend(0, [5], [1], q, k, v).shape == (1, GEO.q_size)
        sender.stop()
        proc.communicate(timeout=30)
    finally:
        proc.kill()


@pytest.mark.e2e
def test_a_receiver_whose_sender_died_stops_polling(shm_path):
    """A sender that died sends no STOP: the receiver sees its process gone and ends by itself,
    rather than polling (a GPU's kernels and a core) for ever."""
    region = ExchangeRegion.create(shm_path / "weaver", GEO)
    gone = subprocess.Popen(["true"])
    gone.wait()  # reaped: its pid names no process
    region.set_counter(SENDER_PID, gone.pid)
    proc = start_receiver(shm_path / "weaver", steps=0)
    try:
        out, _ = proc.communicate(timeout=15)
    finally:
        proc.kill()
    assert proc.returncode == 0 and out.split()[1] == "0"  # its digest, and no task served


def test_a_receiver_that_cannot_allocate_gives_its_region_back(shm_path, dev):
    """A receiver whose blocks do not fit fails, and what it took is given back: the region can
    be served by the next receiver (before, it stayed registered: "already registered")."""
    from medusa.cuda.errors import CudaError
    from medusa.weaver.receiver import WeaverReceiver

    region = ExchangeRegion.create(shm_path / "r", GEO)
    opened = ExchangeRegion(shm_path / "r")
    free = dev.mem_info()[0]
    with pytest.raises(CudaError, match="out of memory"):
        WeaverReceiver(opened, dev, 2**31 // GEO.max_seqs - 1, 4)
    assert dev.mem_info()[0] == free
    WeaverReceiver(opened, dev, 16, 4).close()
    region.close()
