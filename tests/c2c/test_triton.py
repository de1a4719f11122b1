"""HybridGEMM in Triton, run by the Triton interpreter on the CPU: equal to numpy for every split,
ragged shapes, fp32/fp16/bf16 inputs (fp32 accumulation)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytest.importorskip("torch")
pytest.importorskip("triton")

SCRIPT = r"""
import itertools, json
import numpy as np, torch
from medusa.engine.hybrid_gemm import Tiles
from medusa.c2c.triton_gemm import hybrid_gemm_triton
tiles = Tiles(bm=16, bn=16, bk=16, wbm=16, wbn=16, wbk=32)
errors = {}
shapes = [(20, 40, 48), (33, 17, 70)]
dtypes = [torch.float32, torch.float16, torch.bfloat16]
for (m, n, k), alpha, dtype in itertools.product(shapes, [0.0, 0.25, 0.5, 1.0], dtypes):
    g = torch.Generator().manual_seed(m * n + k)
    x = torch.randn(m, k, generator=g).to(dtype)
    w = torch.randn(n, k, generator=g).to(dtype)
    got = hybrid_gemm_triton(x, w, alpha, tiles).numpy()
    want = x.float().numpy() @ w.float().numpy().T
    errors[f"{m}x{n}x{k} a={alpha} {str(dtype)[6:]}"] = float(np.abs(got - want).max())
print(json.dumps(errors))
"""


def test_triton_hybrid_gemm_matches_numpy_in_the_interpreter():
    import json

    env = {**os.environ, "TRITON_INTERPRET": "1"}
    res = subprocess.run(
        [sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=600
    )
    assert res.returncode == 0, res.stderr[-3000:]
    errors = json.loads(res.stdout.strip().splitlines()[-1])
    assert len(errors) == 24
    # fp32 inputs differ only by summation order; fp16/bf16 inputs are exact in fp32 products.
    bad = {k: v for k, v in errors.items() if v > 1e-3}
    assert not bad, bad
