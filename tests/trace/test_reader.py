"""The trace reader: the format matches the C header, bad files are refused with the offset and
the fix, and `medusa trace` prints what a trace holds."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from medusa.trace import Ev, TraceError, read_trace, recorder_env
from medusa.trace.format import HEADER_SIZE, RECORD_SIZE

ROOT = Path(__file__).parents[2]
PROGRAMS = ROOT / "tests" / "interpose" / "programs"


@pytest.fixture(scope="module")
def trace_file(cprog, run, tmp_path_factory) -> Path:
    prog = cprog("recorded", src_dir=PROGRAMS)
    path = tmp_path_factory.mktemp("tr") / "t.mtr"
    run(prog, env=recorder_env(path))
    return path


def _copy(src: Path, dst_dir: Path) -> Path:
    dst = dst_dir / src.name
    shutil.copy(src, dst)
    shutil.copy(src.with_name(src.name + ".blobs"), dst.with_name(dst.name + ".blobs"))
    return dst


def test_python_event_numbers_match_the_c_header():
    header = (ROOT / "csrc" / "include" / "medusa" / "trace.h").read_text()
    in_c = {m[1]: int(m[2]) for m in re.finditer(r"MEDUSA_EV_(\w+) = (\d+),", header)}
    assert in_c == {e.name: e.value for e in Ev}
    assert f"MEDUSA_TRACE_RECORD_SIZE {RECORD_SIZE}u" in header
    assert f"MEDUSA_TRACE_HEADER_SIZE {HEADER_SIZE}u" in header


@pytest.mark.e2e
def test_a_cut_off_trace_is_refused_naming_the_offset_unless_allowed(trace_file, tmp_path):
    t = _copy(trace_file, tmp_path)
    full = read_trace(t)
    t.write_bytes(t.read_bytes()[:-40])
    with pytest.raises(
        TraceError,
        match=rf"partial record at offset {HEADER_SIZE + (len(full) - 1) * RECORD_SIZE} ",
    ):
        read_trace(t)
    cut = read_trace(t, allow_truncated=True)
    assert len(cut) == len(full) - 1 and not cut.complete


@pytest.mark.e2e
def test_other_files_and_versions_are_refused_with_the_fix(trace_file, tmp_path):
    with pytest.raises(TraceError, match="not a Medusa trace.*not its .blobs side file"):
        read_trace(trace_file.with_name(trace_file.name + ".blobs"))
    t = _copy(trace_file, tmp_path)
    raw = bytearray(t.read_bytes())
    raw[8] = 7
    t.write_bytes(bytes(raw))
    with pytest.raises(
        TraceError, match="version 7 at offset 8, this medusa reads version 1; record it again"
    ):
        read_trace(t)
    with pytest.raises(TraceError, match="no such trace"):
        read_trace(tmp_path / "missing.mtr")


@pytest.mark.e2e
def test_a_truncated_blob_file_is_refused_naming_the_record(trace_file, tmp_path):
    t = _copy(trace_file, tmp_path)
    blobs = t.with_name(t.name + ".blobs")
    blobs.write_bytes(blobs.read_bytes()[:100])
    with pytest.raises(TraceError, match=r"record \d+ at offset \d+ points past the end"):
        read_trace(t)


@pytest.mark.e2e
def test_summarize_prints_counts_memory_kernels_and_graphs(trace_file):
    res = subprocess.run(
        [sys.executable, "-m", "medusa.cli", "trace", "summarize", str(trace_file)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    out = res.stdout
    assert re.search(r"alloc\s+5\s+\(cuMemAlloc_v2 1, cudaMalloc 3, cudaMallocAsync 1\)", out)
    assert re.search(r"launch\s+3\s+\(cudaLaunchKernel 3\)", out)
    assert "peak 1.0 MiB, at the end 0 B" in out  # b, c, d and e live together; all freed
    assert re.search(r"2 launches\s+1 graph nodes\s+vector_add", out)
    # the kernels' image is named (a library's kernels carry its module's handle, not its own)
    assert re.search(r"^  image [0-9a-f]{12} \(libsimcuda_testkernels\.so\): 2 kernels$", out, re.M)
    assert "? (" not in out
    assert re.search(
        r"4 nodes \(2 kernel, 1 memcpy, 1 memset\), 3 edges, instantiated 1x, replayed 2x", out
    )


@pytest.mark.e2e
def test_summarize_of_a_cut_off_trace_says_how_to_read_it(trace_file, tmp_path):
    t = _copy(trace_file, tmp_path)
    t.write_bytes(t.read_bytes()[:-1])
    res = subprocess.run(
        [sys.executable, "-m", "medusa.cli", "trace", "summarize", str(t)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert res.returncode == 1
    assert "--allow-truncated" in res.stderr


@pytest.mark.e2e
def test_trace_record_runs_a_command_and_refuses_to_overwrite(cprog, tmp_path):
    prog = cprog("recorded", src_dir=PROGRAMS)
    out = tmp_path / "cli.mtr"
    cmd = [sys.executable, "-m", "medusa.cli", "trace", "record", "-o", str(out), "--", str(prog)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert "checksum" in res.stdout and read_trace(out).complete
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert again.returncode == 2 and "pass --force" in again.stderr
