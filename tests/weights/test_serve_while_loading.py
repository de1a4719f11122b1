"""Serving while the weights arrive (medusa.engine.layer_gate): a restored start is ready with its
store's load held part way, and its first request, blocked on a layer whose weights are not in,
gives the logits of a normal start once they are; a bad chunk found with that request in flight
falls back to the model file and the request still answers correctly. A control without the gate
reads the device's uncopied (poison) bytes and gets other logits: the comparison can fail."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from medusa.engine.loader import open_model
from medusa.engine.loader.stored import model_record
from medusa.weights import open_store, write_store
from medusa.weights.format import MIN_CHUNK
from tests.weights.conftest import CONFIG, materialize, restore_env, run_engine

# Starts processes (see pyproject.toml's e2e marker): not in the fast subset.
pytestmark = pytest.mark.e2e

# Holds the load at chunk HOLD, starts the engine, and (gated) releases the load once the first
# request blocks on a layer, or (ungated: every part let through at once) after the first step.
SCRIPT = """
import hashlib, json, logging, sys, threading, time
logging.basicConfig(level=logging.INFO)
from medusa.engine import layer_gate
from medusa.engine.config import EngineConfig
from medusa.engine.llm_engine import LLMEngine
from medusa.engine.sampling import SamplingParams
from medusa.engine.weight_load import WeightLoad
cfg, art, store, hold, mode = json.loads(sys.argv[1]), *sys.argv[2:4], int(sys.argv[4]), sys.argv[5]
WeightLoad.hold = hold
if mode == "ungated":
    layer_gate.LayerGate._wait = lambda self, end: None
e = LLMEngine(EngineConfig(**cfg), artifact=art, store=store)
gate, load = e.runner.gate, e._loading
out = {"gated": gate is not None, "done_at_ready": load.progress.num_done if load else None}
# What a GPU would need and simcuda does not enforce (it runs work as it is queued): each gated
# part's kernels come after an event recorded on the load's stream and waited for on the one the
# kernels run on. G: a part waits for bytes not yet covered; R/W: record, wait; L: a kernel.
order = []
b, dev = e.device.b, e.device
call, launch, wait = b.call, dev.launch, layer_gate.LayerGate._wait
def spy_call(name, *args):
    if name == "cudaEventRecord":
        order.append("R:load" if args[1].value == load.stream else "R:other")
    elif name == "cudaStreamWaitEvent":
        order.append("W:compute" if args[0].value == dev.stream else "W:other")
    return call(name, *args)
def spy_launch(*args, **kw):
    order.append("L")
    return launch(*args, **kw)
def spy_wait(self, end):
    if end > self.covered:
        order.append("G")
    return wait(self, end)
if mode == "gated":
    b.call, dev.launch, layer_gate.LayerGate._wait = spy_call, spy_launch, spy_wait
stepped = threading.Event()
def release():
    while mode == "gated" and gate.waiting is None:
        time.sleep(0.005)
    out["blocked_on"] = gate.waiting
    time.sleep(0.2)
    out["stepped_while_blocked"] = stepped.is_set()
    load.progress.release()
seq = e.add_request([5, 17, 42, 7, 99, 3], SamplingParams(max_tokens=5))
releaser = threading.Thread(target=release)
if mode == "gated":
    releaser.start()
h = hashlib.sha256()
while e.has_unfinished():
    e.step()
    stepped.set()
    h.update(e.runner.last_logits(1).tobytes())
    if mode == "ungated" and not releaser.is_alive() and "blocked_on" not in out:
        releaser.start()
releaser.join()
gates = [i for i, x in enumerate(order) if x == "G"]
out["gates"] = len(gates)
out["ordered"] = all(order[i + 1:i + 3] == ["R:load", "W:compute"] for i in gates)
out.update(tokens=seq.completion_ids, logits=h.hexdigest(), restored=e.restored,
           store_error=e.store_error, settled=e.runner.gate is None and e._loading is None,
           timings=e.timings)
print(json.dumps(out), flush=True)
"""


@pytest.fixture(scope="module")
def setup(tiny_hf, tmp_path_factory):
    """(model, artifact, a store of 64 KiB chunks, the chunk in the middle of the last layer)."""
    tmp = tmp_path_factory.mktemp("swl")
    art = materialize(tiny_hf, tmp / "art")
    src = open_model(str(tiny_hf))
    store = tmp / "small.store"
    write_store(store, list(src.spec.weight_shapes().items()), src.weights(), model_record(src),
                chunk_size=MIN_CHUNK)  # fmt: skip
    with open_store(store) as s:
        prefix = f"layers.{src.spec.num_layers - 1}."
        last = [t for t in s.header.tensors if t.name.startswith(prefix)]
        lo, hi = min(t.offset for t in last), max(t.end for t in last)
        assert s.header.num_chunks > 8
    return tiny_hf, art, store, (lo + hi) // 2 // MIN_CHUNK


def _with_a_bad_chunk(store: Path, chunk: int, out: Path) -> Path:
    """A copy of the store with one bit of `chunk` flipped."""
    raw = bytearray(store.read_bytes())
    with open_store(store) as s:
        raw[s.header.data_offset + chunk * MIN_CHUNK + 100] ^= 0x01
    out.write_bytes(raw)
    return out


def run_gated(cfg: dict, art: Path, store: Path, hold: int, mode: str, tmp: Path):
    cfg = {**cfg, "serve_while_loading": True}
    cmd = [sys.executable, "-c", SCRIPT, json.dumps(cfg), str(art), str(store), str(hold), mode]
    env = restore_env(tmp)
    if mode == "ungated":  # NOTE: the control reads weights still being copied, on purpose
        env["MEDUSA_SIM_RACECHECK"] = "0"
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1]), res.stderr


def test_the_first_request_waits_for_its_layer_and_gives_a_normal_starts_logits(setup, tmp_path):
    model, art, store, hold = setup
    cfg = {**CONFIG, "model": str(model)}
    normal, _ = run_engine(cfg, tmp_path)
    got, _ = run_gated(cfg, art, store, hold, "gated", tmp_path)
    assert got["gated"] and got["restored"] and got["store_error"] is None, got
    assert got["done_at_ready"] <= hold  # ready with the last layer's weights still held back
    assert got["blocked_on"] and not got["stepped_while_blocked"]
    assert (got["tokens"], got["logits"]) == (normal["tokens"], normal["logits"])
    assert got["settled"]
    # the wait for the rest of the load was the first request's, not a start-up stage
    assert "first_request_weights_wait" in got["timings"] and "weights_wait" not in got["timings"]
    # the layers after layer 0 and the head waited, each through an event before its kernels
    assert got["gates"] >= 2 and got["ordered"], got


def test_without_the_gate_the_held_back_weights_give_other_logits(setup, tmp_path):
    model, art, store, hold = setup
    cfg = {**CONFIG, "model": str(model)}
    normal, _ = run_engine(cfg, tmp_path)
    got, _ = run_gated(cfg, art, store, hold, "ungated", tmp_path)
    assert got["logits"] != normal["logits"]


def test_a_bad_late_chunk_found_mid_request_reloads_and_redoes_the_step(setup, tmp_path):
    model, art, store, hold = setup
    bad = _with_a_bad_chunk(store, hold, tmp_path / "bad.store")
    cfg = {**CONFIG, "model": str(model)}
    normal, _ = run_engine(cfg, tmp_path)
    got, log = run_gated(cfg, art, bad, hold, "gated", tmp_path)
    assert got["blocked_on"] and not got["stepped_while_blocked"]  # the request was in flight
    assert f"chunk {hold} of" in got["store_error"] and "corrupted" in got["store_error"]
    assert "weight store not used" in log
    assert got["restored"]
    assert (got["tokens"], got["logits"]) == (normal["tokens"], normal["logits"])


@pytest.mark.parametrize("setting", [False, None])  # None, on simcuda: off
def test_no_serve_while_loading_waits_for_the_whole_load(setup, tmp_path, setting):
    model, art, store, _ = setup
    cfg = {**CONFIG, "model": str(model), "serve_while_loading": setting}
    got, _ = run_engine(cfg, tmp_path, art, store)
    assert got["restored"] and "weights_wait" in got["timings"]
    assert "weights_first_layer" not in got["timings"]


# --require-artifact: a bad chunk found mid-request may not fall back, and the weights it left
# part copied must not be read by any later step (the engine answered with them before).
REQUIRED = """
import json, sys, threading, time
from medusa.engine.config import EngineConfig
from medusa.engine.llm_engine import LLMEngine
from medusa.engine.sampling import SamplingParams
from medusa.engine.weight_load import WeightLoad
cfg, art, store, hold = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4])
WeightLoad.hold = hold
e = LLMEngine(EngineConfig(**cfg), artifact=art, store=store, require_artifact=True)
gate, load = e.runner.gate, e._loading
def release():
    while gate.waiting is None:
        time.sleep(0.005)
    load.progress.release()
threading.Thread(target=release).start()
e.add_request([5, 17, 42, 7, 99, 3], SamplingParams(max_tokens=5))
errors = []
for _ in range(3):
    try:
        e.step()
        errors.append(None)
    except Exception as x:
        errors.append(f"{type(x).__name__}: {x}")
print(json.dumps(errors), flush=True)
"""


def test_require_artifact_a_bad_late_chunk_fails_this_step_and_every_later_one(setup, tmp_path):
    model, art, store, hold = setup
    bad = _with_a_bad_chunk(store, hold, tmp_path / "bad.store")
    cfg = {**CONFIG, "model": str(model), "serve_while_loading": True}
    cmd = [sys.executable, "-c", REQUIRED, json.dumps(cfg), str(art), str(bad), str(hold)]
    res = subprocess.run(
        cmd, env=restore_env(tmp_path), capture_output=True, text=True, timeout=300
    )
    assert res.returncode == 0, res.stderr[-3000:]
    first, *later = json.loads(res.stdout.strip().splitlines()[-1])
    assert first.startswith("RestoreError") and f"chunk {hold} of" in first, first
    assert all(x and "the weights are not all in" in x for x in later), later
