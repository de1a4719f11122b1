"""Tensor parallelism in the reference engine, on simcuda: N rank processes (one device each,
joined through libmedusa_nccl) given the same prompts give the same greedy tokens as one
process with the whole model, at N = 2 and 4, for SmolLM2 (9 query heads over 3 KV heads: the
heads do not split evenly) and the tiny Llama and Qwen2 models, including (tiny models) a
prompt prefilled in chunks. The all-reduce sums the row-parallel products in another order
than one GEMM does: the logits differ by float32 rounding, within the tolerance asserted."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from medusa.cuda import load_backend
from medusa.cuda.nccl import Nccl
from medusa.engine.config import EngineConfig
from medusa.engine.loader import open_model
from medusa.engine.tensor_parallel import TensorParallelError, check_tensor_parallel, plan_shard
from tests.engine.tiny_models import write_hf, write_qwen2
from tests.processes import clean_env

# Starts processes (see pyproject.toml's e2e marker): not in the fast subset.
pytestmark = pytest.mark.e2e

PROGRAM = Path(__file__).parent / "programs" / "tp_rank.py"
LOGITS_ATOL = 2e-4  # measured 2026-11-27: 2.3e-6 (tiny Llama, 2 ranks), 4.4e-5 (SmolLM2, 4 ranks)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("tp-models")
    write_hf(root / "llama", {})
    write_qwen2(root / "qwen2")
    return {"smollm2": "smollm2", "llama": str(root / "llama"), "qwen2": str(root / "qwen2")}


def run_ranks(model: str, n: int, out: Path, *flags: str, env: dict | None = None) -> list[dict]:
    """Every rank's rank<R>.json (tp_rank.py), its logits under "logits"; `env`: the ranks'
    environment (by default clean_env())."""
    out.mkdir()
    uid = Nccl(load_backend("sim")).unique_id().hex()
    procs = [
        subprocess.Popen([sys.executable, str(PROGRAM), uid, str(n), str(r), model, str(out),
                          *(["short"] if model == "smollm2" else []), *flags],
                         env={**(env or clean_env()), "MEDUSA_NCCL_TIMEOUT": "60"},
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for r in range(n)
    ]  # fmt: skip
    errs = [p.communicate(timeout=600)[1] for p in procs]
    assert [p.returncode for p in procs] == [0] * n, [e[-1500:] for e in errs]
    return [
        {**json.loads((out / f"rank{r}.json").read_text()), "logits": np.load(out / f"rank{r}.npy")}
        for r in range(n)
    ]


@pytest.mark.parametrize("model", ["smollm2", "llama", "qwen2"])
def test_two_and_four_ranks_give_the_tokens_of_one(models, model, tmp_path):
    one = run_ranks(models[model], 1, tmp_path / "1")[0]
    if model == "llama":  # a group of one: the collectives run, over one rank (the residual
        # adds after the row-parallel products round once more than a GEMM that accumulates)
        alone = run_ranks(models[model], 1, tmp_path / "1tp", "tp")[0]
        assert alone["tokens"] == one["tokens"]
        assert float(np.abs(alone["logits"] - one["logits"]).max()) < LOGITS_ATOL
    for n in (2, 4):
        ranks = run_ranks(models[model], n, tmp_path / str(n))
        for r in ranks:
            assert r["tokens"] == one["tokens"], f"{n} ranks"
            diff = float(np.abs(r["logits"] - one["logits"]).max())
            assert diff < LOGITS_ATOL, f"{n} ranks: logits differ by up to {diff:.2e}"
        assert all(r["blocks"] == ranks[0]["blocks"] for r in ranks)  # one shared block table
        # every rank's logits are the same bits: the same all-reduce order, the same all-gather
        assert all(np.array_equal(r["logits"], ranks[0]["logits"]) for r in ranks)


def test_heads_split_by_kv_head_or_copied_when_ranks_outnumber_them():
    spec = open_model().spec  # SmolLM2: 9 query heads in 3 groups of 3
    two = [plan_shard(spec, r, 2) for r in range(2)]
    assert [(s.q_heads, s.kv_heads) for s in two] == [
        (tuple(range(3)), (0,)),
        (tuple(range(3, 9)), (1, 2)),
    ]
    four = [plan_shard(spec, r, 4) for r in range(4)]
    # query heads 0-1 | 2-3 | 4-5 | 6-8: rank 1's read KV heads 0 and 1 (one each)
    assert [s.kv_heads for s in four] == [(0,), (0, 1), (1,), (2,)]
    assert [len(s.q_heads) for s in four] == [2, 2, 2, 3]
    assert sum(len(s.inter) for s in four) == spec.intermediate_size
    assert all(s.vocab_parallel and len(s.vocab) == spec.vocab_size // 4 for s in four)
    # 8 query heads in groups of 4 over 3 ranks: rank 1's heads 2-4 read KV head 0 twice and
    # KV head 1 once, a grouping no kernel takes: one copy per query head
    odd = dataclasses.replace(spec, num_heads=8, num_kv_heads=2)
    assert plan_shard(odd, 1, 3).kv_heads == (0, 0, 1)
    uneven = dataclasses.replace(odd, vocab_size=49153)  # does not split in 3: replicated
    assert (
        plan_shard(uneven, 1, 3).vocab == range(49153)
        and not plan_shard(uneven, 1, 3).vocab_parallel
    )
    with pytest.raises(TensorParallelError, match="at most 9"):
        plan_shard(spec, 0, 16)


def test_what_decides_per_rank_is_refused_before_any_work():
    with pytest.raises(TensorParallelError, match="Weaver .* kv_memory='elastic'"):
        check_tensor_parallel(EngineConfig(kv_memory="elastic"))
    with pytest.raises(TensorParallelError, match="weights='host' maps one store"):
        check_tensor_parallel(EngineConfig(weights="host"))
    check_tensor_parallel(EngineConfig())
