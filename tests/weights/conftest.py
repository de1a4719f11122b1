from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from gguf import GGMLQuantizationType as T

from medusa.trace import recorder_env
from medusa.weights import open_store
from tests.engine.tiny_models import write_gguf, write_hf
from tests.processes import clean_env, medusa

CONFIG = {
    "max_num_seqs": 2,
    "max_model_len": 128,
    "max_num_batched_tokens": 64,
    "kv_cache_memory": 4 << 20,
}
OPTS = ["--max-num-seqs", "2", "--max-model-len", "128", "--max-num-batched-tokens", "64",
        "--kv-cache-memory", str(4 << 20)]  # fmt: skip

# Starts an engine, decodes greedily, prints what a user would compare (and where weights and
# graphs came from); with "wait", stays up until stdin closes.
ENGINE = """
import hashlib, json, logging, os, sys
from medusa.engine.config import EngineConfig
logging.basicConfig(level=logging.INFO)
from medusa.engine.llm_engine import LLMEngine
from medusa.engine.sampling import SamplingParams
cfg, art, store = json.loads(sys.argv[1]), sys.argv[2] or None, sys.argv[3] or None
e = LLMEngine(EngineConfig(**cfg), artifact=art, store=store,
              store_checked=os.environ.get("MEDUSA_STORE_CHECKED", ""))
seq = e.add_request([5, 17, 42, 7, 99, 3], SamplingParams(max_tokens=5))
h = hashlib.sha256()
while e.has_unfinished():
    e.step()
    h.update(e.runner.last_logits(1).tobytes())
print(json.dumps({"tokens": seq.completion_ids, "logits": h.hexdigest(), "restored": e.restored,
                  "restore_error": e.restore_error, "store_error": e.store_error,
                  "source": type(e.source).__name__, "timings": e.timings}), flush=True)
if "wait" in sys.argv[4:]:
    sys.stdin.read()
"""


def engine_cmd(config: dict, artifact: Path | None, store: Path | None, *extra: str) -> list[str]:
    return [sys.executable, "-c", ENGINE, json.dumps(config), str(artifact or ""),
            str(store or ""), *extra]  # fmt: skip


def restore_env(tmp: Path) -> dict[str, str]:
    return recorder_env(tmp / "restore-%p.mtr", mode="restore", base=clean_env())


def run_engine(
    config: dict,
    tmp: Path,
    artifact: Path | None = None,
    store: Path | None = None,
    env: dict[str, str] | None = None,
):
    """Runs ENGINE (under the recorder in restore mode when given an artifact) with extra `env`;
    (result, log)."""
    env = {**(restore_env(tmp) if artifact else clean_env()), **(env or {})}
    res = subprocess.run(engine_cmd(config, artifact, store), env=env, capture_output=True,
                         text=True, timeout=300)  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1]), res.stderr


def materialize(model: Path, out: Path, *opts: str) -> Path:
    res = medusa("materialize", str(model), *OPTS, *opts, "--out", str(out))
    assert res.returncode == 0, res.stderr[-3000:]
    return out


@pytest.fixture(scope="session")
def tiny_gguf(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    write_gguf(path, [T.Q8_0, T.Q4_K])
    return path


@pytest.fixture(scope="session")
def tiny_hf(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("hf") / "tiny"
    write_hf(path, {})
    return path


def copy_with_bad_chunk(art: Path, dst: Path, offset: int, bit: int) -> Path:
    """A copy of artifact ART whose weight store has one bit flipped, `offset` bytes into its
    chunk 1 (the store must have at least two chunks)."""
    copy = shutil.copytree(art, dst)
    path = copy / "weights.store"
    with open_store(path) as store:
        assert store.header.num_chunks >= 2
        at = store.header.data_offset + store.header.chunk_range(1)[0] + offset
    raw = bytearray(path.read_bytes())
    raw[at] ^= bit
    path.write_bytes(raw)
    return copy
