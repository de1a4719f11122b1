"""The partitioned executor: a decode graph split across two simcuda processes at random
kernel-to-device placements gives the tokens one device gives. A dependency the access analysis
missed would show up as a stale read on one side, and so as a divergence."""

from __future__ import annotations

import json
import subprocess
import time

from gguf import GGMLQuantizationType as T

from medusa.child import python_module
from medusa.engine.config import EngineConfig
from medusa.tessera.record import record_instrumented
from medusa.trace import recorder_env
from tests.engine.tiny_models import write_gguf
from tests.materialize.conftest import clean_env, medusa

CONFIG = {"max_num_seqs": 2, "max_model_len": 128, "max_num_batched_tokens": 64,
          "kv_cache_memory": 4 << 20}  # fmt: skip


def test_random_placements_over_two_processes_give_one_devices_tokens(tmp_path):
    model = tmp_path / "tiny.gguf"
    write_gguf(model, [T.Q8_0])
    art = tmp_path / "art"
    opts = [f"--{k.replace('_', '-')}={v}" for k, v in CONFIG.items()]
    res = medusa("materialize", str(model), *opts, "--no-weights", "--out", str(art))
    assert res.returncode == 0, res.stderr[-3000:]
    trace = tmp_path / "accesses.mtr"
    record_instrumented(EngineConfig(model=str(model), **CONFIG), trace)  # type: ignore[arg-type]
    sock = tmp_path / "exchange.sock"
    procs = []
    for rank in (0, 1):
        env = recorder_env(tmp_path / f"r{rank}-%p.mtr", mode="restore", base=clean_env())
        cmd = python_module("medusa.tessera.partition_check", str(art), str(trace), str(rank),
                            str(sock), "--placements", "100")  # fmt: skip
        procs.append(subprocess.Popen(cmd, env=env, text=True, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE))  # fmt: skip
        while rank == 0 and not sock.exists() and procs[0].poll() is None:
            time.sleep(0.05)
    outs = [p.communicate(timeout=600) for p in procs]
    for p, (_, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err[-3000:]
    results = [json.loads(out.strip().splitlines()[-1]) for out, _ in outs]
    for r in results:
        assert r["placements"] == 100 and r["bad"] == [], r["bad"][:3]
        assert all(len(t) == 8 for t in r["reference"])
        assert r["segments"] > 5  # placements really alternate between the devices
    assert results[0]["reference"] == results[1]["reference"]
