"""scripts/gpu/torch_restore.sh before a GPU is lent: its Python compiles, the decoder's step runs
on the CPU with every batch size it captures (shapes, dtypes, finite logits), and without a CUDA
device the check skips with exit 0. (Its simcuda twin: test_caching_allocator.py.)"""

from __future__ import annotations

import importlib.util
import json
import os
import py_compile
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

GPU = Path(__file__).parents[2] / "scripts" / "gpu"
NO_TORCH = importlib.util.find_spec("torch") is None

STEP_ON_CPU = """
import json, torch, decoder
torch.set_grad_enabled(False)
m = decoder.Decoder(torch.device("cpu"))
out = {}
for n in decoder.BATCHES:
    m.tokens[:n].copy_(torch.arange(n) * 7)
    m.positions[:n].copy_(torch.arange(n) + 3)
    m.step(n)
    out[n] = [list(m.out.shape), str(m.out.dtype), bool(m.out[:n].isfinite().all()),
              float(m.out[:n].std())]
print(json.dumps(out))
"""


def test_its_python_compiles(tmp_path):
    for src in sorted((GPU / "torch_restore").glob("*.py")):
        py_compile.compile(str(src), cfile=str(tmp_path / (src.stem + ".pyc")), doraise=True)


@pytest.mark.e2e
@pytest.mark.skipif(NO_TORCH, reason="torch is not installed")
def test_the_decoder_steps_on_the_cpu_at_every_batch_size():
    res = subprocess.run(
        [sys.executable, "-c", STEP_ON_CPU],
        cwd=GPU / "torch_restore",
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout.splitlines()[-1])
    assert sorted(map(int, out)) == [1, 2, 4, 8]
    for shape, dtype, finite, std in out.values():
        assert shape == [8, 4096] and dtype == "torch.float32" and finite and 0.5 < std < 2


@pytest.mark.e2e
@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="this machine has a GPU")
def test_without_a_cuda_device_the_check_skips():
    env = {**os.environ, "PYTHON": sys.executable}
    res = subprocess.run(
        ["bash", str(GPU / "torch_restore.sh")],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    want = "skipped: no torch" if NO_TORCH else "skipped: no CUDA device"
    assert res.stdout.splitlines()[-1].startswith(want), res.stdout
