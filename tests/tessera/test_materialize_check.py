"""`medusa materialize --check-accesses`: a third, instrumented run checks the two-run pointer
classification against the accesses kernels make; strict refuses on a disagreement."""

from __future__ import annotations

import sys

import pytest
from gguf import GGMLQuantizationType as T

from medusa.materialize.analysis import MaterializeError
from medusa.tessera.record import pointer_check
from tests.engine.tiny_models import write_gguf
from tests.processes import medusa

# Starts processes (see pyproject.toml's e2e marker): not in the fast subset.
pytestmark = pytest.mark.e2e

OPTS = ["--max-num-seqs", "2", "--max-model-len", "128", "--max-num-batched-tokens", "64",
        "--kv-cache-memory", str(4 << 20), "--no-weights"]  # fmt: skip


def test_materialize_checks_pointer_classification_against_accesses(tmp_path):
    model = tmp_path / "tiny.gguf"
    write_gguf(model, [T.Q8_0])
    out = tmp_path / "art"
    res = medusa("materialize", str(model), *OPTS, "--check-accesses", "strict", "--out", str(out))
    assert res.returncode == 0, res.stderr[-3000:]
    assert "checking the pointer classification against recorded accesses" in res.stderr
    line = next(x for x in res.stderr.splitlines() if "kernel nodes checked" in x)
    checked = int(line.split()[0])
    assert checked > 20 and "0 without recorded accesses, 0 disagreements" in line, line
    assert (out / "manifest.json").is_file()


def test_check_accesses_is_refused_where_it_cannot_run(tmp_path):
    res = medusa("materialize", "--command", "--check-accesses", "warn", "--", sys.executable)
    assert res.returncode == 2 and "drop --check-accesses" in res.stderr
    try:
        pointer_check("cuda", strict=False)
    except MaterializeError as e:
        assert "PTX instrumentation" in str(e) and "MEDUSA_DEVICE=sim" in str(e)
    else:
        raise AssertionError("a GPU materialize with --check-accesses was not refused")
