"""Decoding the plan is bounded by the uncompressed size the manifest records: a zstd frame that
declares or yields more, or msgpack headers that claim more than the bytes hold, are refused
before the memory is taken (these used to peak at gigabytes from a plan of kilobytes)."""

from __future__ import annotations

import struct
import tracemalloc

import msgpack
import pytest
import zstandard

from medusa.artifact import ArtifactError, load_artifact
from medusa.artifact.payload import MAX_RAW_SIZE
from tests.artifact.conftest import edit_manifest, manifest_of, replace_plan

# Starts processes (see pyproject.toml's e2e marker): not in the fast subset.
pytestmark = pytest.mark.e2e

PEAK_LIMIT = 32 << 20


def _load_peak(art) -> tuple[BaseException | None, int]:
    tracemalloc.start()
    try:
        load_artifact(art)
        err = None
    except Exception as e:  # the test asserts on what was raised
        err = e
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return err, peak


def _frame_claiming(size: int) -> bytes:
    """A zstd frame header that declares `size` bytes of content, then one empty last block."""
    magic = struct.pack("<I", 0xFD2FB528)
    descriptor = bytes([0xC0, 0x00])  # 8-byte content size, a window descriptor follows
    return magic + descriptor + struct.pack("<Q", size) + b"\x01\x00\x00"


def _zstd(raw: bytes, *, content_size: bool = True) -> bytes:
    return zstandard.ZstdCompressor(level=3, write_content_size=content_size).compress(raw)


CASES = {
    "frame declares 1 TiB": (
        lambda raw: (_frame_claiming(1 << 40), None),
        "declares 1099511627776",
    ),
    "frame declares no size": (
        lambda raw: (_zstd(raw, content_size=False), None),
        "declares no size",
    ),
    "frame is 200 MB of zeros": (
        lambda raw: (_zstd(bytes(200 << 20)), None),
        "declares 209715200 bytes uncompressed, the manifest",
    ),
    "manifest claims more than medusa decodes": (
        lambda raw: (_zstd(bytes(16)), MAX_RAW_SIZE + 1),
        f"more than the {MAX_RAW_SIZE} this medusa decodes",
    ),
    # 1.5 KB of zstd that would be 50 million empty lists: 3.4 GB of Python objects.
    "a kilobyte claiming 50 MB": (
        lambda raw: _consistent(b"\xdd" + struct.pack(">I", 50_000_000) + b"\x90" * 50_000_000),
        "more than 4096 times as many as any plan",
    ),
    # Within the compression ratio, still 72 bytes of Python for each byte of msgpack.
    "a stream of empty containers": (
        lambda raw: _consistent(b"\xdd" + struct.pack(">I", 900_000) + b"\x90" * 900_000),
        "16 times its size (a stream of tiny containers)",
    ),
    # Each header claims fewer items than the payload's length (msgpack's own default limit), so
    # only the walk of the headers stops them: msgpack preallocates every claim, 1024 deep.
    "nested array headers": (
        lambda raw: _consistent(b"\xdd\x00\x00\x71\x48" * 6000),
        "msgpack headers claim more",
    ),
    "nested map headers": (
        lambda raw: _consistent(b"\xdf\x00\x00\x38\xa4" * 6000),
        "msgpack headers claim more",
    ),
    "a huge bin header": (lambda raw: _consistent(b"\xc6\xff\xff\xff\xff"), "msgpack headers"),
    "an extension type": (
        lambda raw: _consistent(msgpack.packb({"graphs": msgpack.ExtType(1, b"x")})),
        "msgpack type a plan never has",
    ),
    "trailing data": (lambda raw: _consistent(raw + b"\xc0"), "msgpack headers"),
    "not a plan": (lambda raw: _consistent(msgpack.packb([1, 2, 3])), "not a restore plan"),
}


def _consistent(raw: bytes) -> tuple[bytes, int]:
    """A payload whose frame and manifest agree on its size: only the msgpack checks are left."""
    return _zstd(raw), len(raw)


@pytest.mark.parametrize("case", list(CASES))
def test_payload_beyond_its_recorded_size_is_refused_within_bounded_memory(art, case):
    make, message = CASES[case]
    raw = zstandard.ZstdDecompressor().decompress((art / "plan.msgpack.zst").read_bytes())
    payload, raw_size = make(raw)
    replace_plan(art, payload, raw_size)
    err, peak = _load_peak(art)
    assert isinstance(err, ArtifactError), err
    assert "plan.msgpack.zst" in str(err) and message in str(err)
    assert peak < PEAK_LIMIT, f"{peak >> 20} MiB"


def test_the_real_plan_decodes_within_bounds(art):
    err, peak = _load_peak(art)
    assert err is None
    assert manifest_of(art)["files"]["plan.msgpack.zst"]["raw_size"] > 0
    assert peak < PEAK_LIMIT


def test_a_plan_file_larger_than_any_frame_of_its_size_is_not_read(art):
    """A (sparse, say) plan file far larger than zstd makes of the recorded size is refused
    before it is read or hashed."""
    replace_plan(art, b"\0" * (4 << 20), 1000)
    err, peak = _load_peak(art)
    assert isinstance(err, ArtifactError), err
    assert "cannot be a zstd frame of the 1000 bytes" in str(err)
    assert peak < 1 << 20  # the 4 MiB were never read


def test_a_file_stated_over_the_size_limit_is_refused_by_the_schema(art):
    def huge(m: dict) -> None:
        m["files"]["plan.msgpack.zst"]["size"] = 100 << 30

    edit_manifest(art, huge)
    err, _ = _load_peak(art)
    assert isinstance(err, ArtifactError) and "files.plan.msgpack.zst.size" in str(err)
