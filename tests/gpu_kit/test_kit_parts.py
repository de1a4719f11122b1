"""SmolLM2 crosses to the lent GPU machine in two device calls: `scripts/gpu/kit.sh split` cuts
it in two parts under 50 MiB with a sha256 manifest, `kit.sh join` puts it back together there,
and refuses a part that does not match (nothing is written then)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

# Starts processes (see pyproject.toml's e2e marker): not in the fast subset.
pytestmark = pytest.mark.e2e

KIT_SH = Path(__file__).parents[2] / "scripts" / "gpu" / "kit.sh"
LIMIT = 50 * 2**20


def kit(*args: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(KIT_SH), *map(str, args)], capture_output=True, text=True,
                          timeout=60)  # fmt: skip


@pytest.fixture
def split_model(tmp_path: Path) -> tuple[Path, Path, list[Path]]:
    """(model, manifest, [part1, part2]) of a 3 MiB + 1 byte 'model'."""
    model = tmp_path / "model.gguf"
    model.write_bytes(os.urandom(3 * 2**20 + 1))
    res = kit("split", model, tmp_path / "kit")
    assert res.returncode == 0, res.stderr
    manifest = Path(res.stdout.strip())
    parts = [tmp_path / "kit" / f"part{i}" / f"model.gguf.part{i}" for i in (1, 2)]
    return model, manifest, parts


def test_the_joined_parts_are_the_model_byte_for_byte(tmp_path, split_model):
    model, manifest, parts = split_model
    assert manifest == tmp_path / "kit" / "common" / "model.gguf.sha256"
    assert sum(p.stat().st_size for p in parts) == model.stat().st_size
    assert all(p.stat().st_size < LIMIT for p in parts)
    res = kit("join", manifest, tmp_path / "joined.gguf", *parts)
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "joined.gguf").read_bytes() == model.read_bytes()


def test_a_corrupt_part_is_refused_by_name_and_nothing_is_written(tmp_path, split_model):
    _, manifest, parts = split_model
    with parts[1].open("r+b") as f:
        f.seek(12345)
        byte = f.read(1)
        f.seek(12345)
        f.write(bytes([byte[0] ^ 1]))
    res = kit("join", manifest, tmp_path / "out" / "joined.gguf", *parts)
    assert res.returncode == 1
    assert "model.gguf.part2: corrupt" in res.stderr and "carry it again" in res.stderr
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_parts_out_of_order_or_missing_are_refused(tmp_path, split_model):
    _, manifest, parts = split_model
    res = kit("join", manifest, tmp_path / "joined.gguf", parts[1], parts[0])
    assert res.returncode == 1 and "expected the part named model.gguf.part1" in res.stderr
    parts[0].unlink()
    res = kit("join", manifest, tmp_path / "joined.gguf", *parts)
    assert res.returncode == 1 and "part1: missing; carry it again" in res.stderr
    assert not (tmp_path / "joined.gguf").exists()


def test_a_file_too_big_for_two_parts_is_refused(tmp_path):
    big = tmp_path / "big.gguf"
    with big.open("wb") as f:
        f.truncate(2 * LIMIT)  # sparse: nothing is read before the refusal
    res = kit("split", big, tmp_path / "kit")
    assert res.returncode == 1
    assert "do not fit in two parts under 50 MiB" in res.stderr
    assert not (tmp_path / "kit" / "part1").exists()
