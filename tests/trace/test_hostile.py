"""A hostile or corrupt trace: the reader, its typed records, `summarize` and the side files raise
only TraceError, naming the byte offset, and never allocate more than the files hold."""

from __future__ import annotations

import os
import struct
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from medusa.trace import Ev, TraceError, read_trace, recorder_env, summarize
from medusa.trace import records as R
from medusa.trace.format import BLOB_MAGIC, HEADER_DTYPE, HEADER_SIZE, MAGIC, RECORD_DTYPE

ROOT = Path(__file__).parents[2]
PROGRAMS = ROOT / "tests" / "interpose" / "programs"
U0 = RECORD_DTYPE.fields["u"][1]  # byte offset of u[0] in a record
BLOB = RECORD_DTYPE.fields["blob"][1]
MODE = HEADER_DTYPE.fields["mode"][1]
EXTREMES = [0, 1, 7, 2**31, 2**32 - 1, 2**63 - 1, 2**63, 2**64 - 4, 2**64 - 1]
PEAK_LIMIT = 16 << 20

settings.register_profile(
    "trace-fuzz",
    max_examples=200,
    deadline=None,
    database=None,  # nothing written into the working tree
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@pytest.fixture(scope="module")
def real(cprog, run, tmp_path_factory) -> tuple[bytes, bytes]:
    """A small real trace and its blobs, as bytes."""
    prog = cprog("recorded", src_dir=PROGRAMS)
    path = tmp_path_factory.mktemp("hostile") / "t.mtr"
    run(prog, env=recorder_env(path))
    return path.read_bytes(), path.with_name(path.name + ".blobs").read_bytes()


def _write(d: Path, trace: bytes, blobs: bytes | None) -> Path:
    p = d / "t.mtr"
    p.write_bytes(trace)
    b = p.with_name(p.name + ".blobs")
    if blobs is None:
        b.unlink(missing_ok=True)
    else:
        b.write_bytes(blobs)
    return p


def _use(p: Path, allow_truncated: bool = False) -> None:
    """Everything a user can do with a trace: read it, build every record, summarize, images."""
    t = read_trace(p, allow_truncated=allow_truncated)
    events = list(t.events())
    summarize(t)
    for e in events:
        if isinstance(e, R.Load):
            t.image(e.sha256)


def _record_offset(trace: bytes, ev: Ev) -> int:
    recs = np.frombuffer(trace, RECORD_DTYPE, offset=HEADER_SIZE)
    return HEADER_SIZE + int(np.flatnonzero(recs["type"] == ev)[0]) * RECORD_DTYPE.itemsize


def _set_u64(buf: bytearray, off: int, value: int) -> None:
    buf[off : off + 8] = value.to_bytes(8, "little")


def _synthetic(rows: list[tuple[int, int, list[int]]]) -> bytes:
    """A trace of (type, t_ns, u words) records, no blobs."""
    h = np.zeros(1, HEADER_DTYPE)
    h["magic"], h["version"], h["header_size"], h["record_size"], h["mode"] = MAGIC, 1, 64, 96, 1
    r = np.zeros(len(rows), RECORD_DTYPE)
    for i, (kind, t_ns, u) in enumerate(rows):
        r[i]["type"], r[i]["seq"], r[i]["t_ns"] = kind, i + 1, t_ns
        r[i]["u"][: len(u)] = u
    return h.tobytes() + r.tobytes()


# ---- one regression per exception the fuzzer found ----


@pytest.mark.e2e
def test_an_api_name_that_is_not_utf8_is_refused_naming_its_record(real, tmp_path):
    trace, blobs = real
    off = _record_offset(trace, Ev.APIS)
    b = bytearray(blobs)
    at = int.from_bytes(trace[off + BLOB : off + BLOB + 8], "little")
    b[at + 4 + 1] = 0xFF  # the first name is "" (api 0): byte 1 starts the second
    with pytest.raises(TraceError, match=rf"record \d+ at offset {off}.*not UTF-8"):
        _use(_write(tmp_path, trace, bytes(b)))


@pytest.mark.e2e
def test_an_unknown_mode_is_refused_naming_the_header_offset(real, tmp_path):
    trace, blobs = real
    t = bytearray(trace)
    t[MODE] = 7
    with pytest.raises(TraceError, match=rf"mode 7 at offset {MODE}"):
        _use(_write(tmp_path, bytes(t), blobs))


@pytest.mark.e2e
@pytest.mark.parametrize(("ev", "word", "value"), [(Ev.FUNC, 3, 1000), (Ev.LOAD, None, 2**31)])
def test_a_count_larger_than_its_blob_is_refused_before_building(real, tmp_path, ev, word, value):
    trace, blobs = real
    off = _record_offset(trace, ev)
    t, b = bytearray(trace), bytearray(blobs)
    if word is not None:  # FUNC: u[3] parameters of 8 bytes each
        _set_u64(t, off + U0 + 8 * word, value)
    else:  # LOAD: the blob starts with the jit option count
        at = int.from_bytes(trace[off + BLOB : off + BLOB + 8], "little")
        b[at + 4 : at + 8] = value.to_bytes(4, "little")
    with pytest.raises(TraceError, match=rf"record \d+ at offset {off} .*claims"):
        _use(_write(tmp_path, bytes(t), bytes(b)))


@pytest.mark.e2e
@pytest.mark.parametrize("value", [2**64 - 4, 2**63, 12, 9])
def test_a_blob_offset_that_wraps_or_is_misaligned_is_refused(real, tmp_path, value):
    trace, blobs = real
    off = _record_offset(trace, Ev.APIS)
    t = bytearray(trace)
    _set_u64(t, off + BLOB, value)
    with pytest.raises(TraceError, match=rf"record \d+ at offset {off} "):
        _use(_write(tmp_path, bytes(t), blobs))


@pytest.mark.e2e
def test_a_blob_length_past_the_end_of_the_side_file_is_refused(real, tmp_path):
    trace, blobs = real
    off = _record_offset(trace, Ev.PROCESS)
    at = int.from_bytes(trace[off + BLOB : off + BLOB + 8], "little")
    b = bytearray(blobs)
    b[at : at + 4] = (2**32 - 1).to_bytes(4, "little")
    with pytest.raises(TraceError, match=rf"record \d+ at offset {off} .*claims 4294967295 bytes"):
        _use(_write(tmp_path, trace, bytes(b)))


def test_summary_of_sizes_that_overflow_stays_small(tmp_path):
    huge = 2**63 // 30 + 2**40  # 30x this wraps int64 to a huge positive bar length
    trace = _synthetic([(Ev.ALLOC, 0, [0x1000, 1]), (Ev.FREE, 100, [0x1000, huge])])
    p = _write(tmp_path, trace, BLOB_MAGIC)
    tracemalloc.start()
    try:
        text = summarize(read_trace(p))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < PEAK_LIMIT and max(map(len, text.splitlines())) < 200


@pytest.mark.e2e
def test_side_files_that_are_not_regular_files_are_refused(real, tmp_path):
    trace, _ = real
    p = _write(tmp_path, trace, None)
    os.mkfifo(
        p.with_name(p.name + ".blobs")
    )  # a reader would block (or, as /dev/zero, fill memory)
    with pytest.raises(TraceError, match=r"\.blobs: .*not a regular file"):
        read_trace(p)


@pytest.mark.e2e
def test_a_planted_or_altered_image_is_refused(real, tmp_path):
    trace, blobs = real
    t = read_trace(_write(tmp_path, trace, blobs))
    (load,) = t.of(R.Load, Ev.LOAD)
    t.images_dir.mkdir(exist_ok=True)
    img = t.images_dir / f"{load.sha256}.img"
    img.write_bytes(b"not the recorded image")
    with pytest.raises(TraceError, match=rf"{img}: .*do not hash to its name"):
        t.image(load.sha256)
    img.unlink()
    secret = tmp_path / "secret"
    secret.write_bytes(b"key")
    img.symlink_to(secret)
    with pytest.raises(TraceError, match=rf"{img}: .*link"):
        t.image(load.sha256)


# ---- property-based: mutations of a real trace, and random bytes ----

MUTATION = st.one_of(
    st.tuples(st.just("flip"), st.integers(0, 1 << 16), st.integers(0, 255)),
    st.tuples(st.just("word"), st.integers(0, 1 << 16), st.sampled_from(EXTREMES)),
    st.tuples(st.just("cut"), st.integers(0, 1 << 16), st.just(0)),
    st.tuples(st.just("splice"), st.integers(0, 1 << 16), st.integers(0, 1 << 16)),
)


def _mutate(buf: bytearray, ops: list[tuple[str, int, int]]) -> bytes:
    for op, a, b in ops:
        if not buf:
            break
        i = a % len(buf)
        if op == "flip":
            buf[i] = b
        elif op == "word":  # an aligned u64 field (count, size, offset) set to an extreme
            i -= i % 8
            buf[i : i + 8] = (b % 2**64).to_bytes(8, "little")[: len(buf) - i]
        elif op == "cut":
            del buf[i:]
        else:
            j = b % len(buf)
            buf[i:i] = buf[j : j + 96]
    return bytes(buf)


def _only_trace_errors(p: Path, allow_truncated: bool) -> None:
    tracemalloc.start()
    try:
        _use(p, allow_truncated)
    except TraceError as e:
        assert "offset" in str(e), str(e)
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    assert peak < PEAK_LIMIT, f"peak {peak} bytes for files of {p.stat().st_size} bytes"


@pytest.mark.e2e
@settings.get_profile("trace-fuzz")
@given(
    trace_ops=st.lists(MUTATION, max_size=4),
    blob_ops=st.lists(MUTATION, max_size=4),
    allow_truncated=st.booleans(),
)
def test_mutated_traces_raise_only_trace_error_in_bounded_memory(
    real, tmp_path, trace_ops, blob_ops, allow_truncated
):
    trace, blobs = real
    p = _write(tmp_path, _mutate(bytearray(trace), trace_ops), _mutate(bytearray(blobs), blob_ops))
    _only_trace_errors(p, allow_truncated)


@pytest.mark.e2e
@settings.get_profile("trace-fuzz")
@given(
    body=st.binary(max_size=2048),
    blobs=st.one_of(st.none(), st.binary(max_size=512).map(lambda b: BLOB_MAGIC + b)),
    records=st.integers(0, 8),
)
def test_random_bytes_raise_only_trace_error_in_bounded_memory(
    real, tmp_path, body, blobs, records
):
    trace, _ = real
    # a valid header and a few real records keep the random tail from failing at the magic
    head = trace[: HEADER_SIZE + records * RECORD_DTYPE.itemsize]
    _only_trace_errors(_write(tmp_path, head + body, blobs), allow_truncated=records % 2 == 0)


@pytest.mark.e2e
def test_the_writer_aligns_blobs_as_the_reader_requires(real):
    trace, blobs = real
    recs = np.frombuffer(trace, RECORD_DTYPE, offset=HEADER_SIZE)
    offs = recs["blob"][recs["blob"] != 0]
    assert offs.size and bool(np.all(offs % 8 == 0)) and blobs[:8] == BLOB_MAGIC
    assert all(struct.unpack_from("<I", blobs, int(o))[0] for o in offs)
