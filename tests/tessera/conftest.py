"""A tiny model's artifact and instrumented recording, made once for the Tessera tests."""

from __future__ import annotations

from pathlib import Path

import pytest
from gguf import GGMLQuantizationType as T

from medusa.engine.config import EngineConfig
from medusa.tessera.record import record_instrumented
from tests.engine.tiny_models import write_gguf
from tests.processes import medusa

CONFIG = {"max_num_seqs": 2, "max_model_len": 128, "max_num_batched_tokens": 64,
          "kv_cache_memory": 4 << 20}  # fmt: skip


@pytest.fixture(scope="session")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A tiny model's artifact and an instrumented recording of its start-up (the model is
    tiny.gguf beside the artifact)."""
    tmp = tmp_path_factory.mktemp("tiny")
    model = tmp / "tiny.gguf"
    write_gguf(model, [T.Q8_0])
    art = tmp / "art"
    opts = [f"--{k.replace('_', '-')}={v}" for k, v in CONFIG.items()]
    res = medusa("materialize", str(model), *opts, "--no-weights", "--out", str(art))
    assert res.returncode == 0, res.stderr[-3000:]
    trace = tmp / "accesses.mtr"
    record_instrumented(EngineConfig(model=str(model), **CONFIG), trace)  # type: ignore[arg-type]
    return art, trace
