"""Library kernels by their API semantics: a GEMM's extents from the call's arguments (shapes,
leading dimensions, transposes, beta), checked against what simcuda's page instrumentation
recorded for the same nodes of a tiny model's decode graphs."""

from __future__ import annotations

import struct

import pytest

from medusa.tessera.accesses import READ, WRITE, analyze
from medusa.tessera.library import api_extents
from medusa.trace import read_trace
from medusa.trace.run_view import RunView

SGEMM = "_ZN5mblas12sgemm_rm_f32EiiiiifPKfiS1_ifPfi"
LAYOUT = [(0, 4), (4, 4), (8, 4), (12, 4), (16, 4), (20, 4), (24, 8), (32, 4), (40, 8),
          (48, 4), (52, 4), (56, 8), (64, 4)]  # fmt: skip


def params(ta, tb, m, n, k, a, lda, b, ldb, beta, c, ldc):  # type: ignore[no-untyped-def]
    out = bytearray(68)
    for (off, _), fmt, v in zip(LAYOUT, "iiiiifQiQifQi", (ta, tb, m, n, k, 1.0, a, lda, b, ldb,
                                                        beta, c, ldc), strict=True):  # fmt: skip
        struct.pack_into("<" + fmt, out, off, v)
    return bytes(out)


def test_gemm_extents_follow_shapes_strides_transposes_and_beta():
    # x[3, 8] @ w[5, 8]^T -> out[3, 5]: w read transposed (5 rows of 8), out written only
    got = api_extents(SGEMM, params(0, 1, 3, 5, 8, 0x1000, 8, 0x2000, 8, 0.0, 0x3000, 5), LAYOUT)
    assert got == [(0x1000, 0x1000 + 24 * 4, READ), (0x2000, 0x2000 + 40 * 4, READ),
                   (0x3000, 0x3000 + 15 * 4, WRITE)]  # fmt: skip
    # a strided A (lda 16) spans its last row's columns only; beta != 0 reads C too
    got = api_extents(SGEMM, params(0, 0, 2, 4, 3, 0x1000, 16, 0x2000, 4, 1.0, 0x3000, 4), LAYOUT)
    assert got[0] == (0x1000, 0x1000 + (16 + 3) * 4, READ)
    assert got[2] == (0x3000, 0x3000 + 8 * 4, READ | WRITE)
    assert api_extents("some_other_kernel", b"", []) is None
    assert api_extents(SGEMM, b"\0" * 8, LAYOUT) is None  # parameters short of the declaration


@pytest.mark.e2e
def test_api_extents_agree_with_the_instrumented_pages(tiny):
    """Every GEMM node of the tiny model's decode graphs: its extents from the arguments, rounded
    out to the 4 KiB pages simcuda records, are the pages recorded, read and written alike."""
    _, trace = tiny
    view = RunView.build(read_trace(trace))
    by_api, recorded = analyze(view), analyze(view, api=False)
    checked = 0
    for g_api, g_rec in zip(by_api, recorded, strict=True):
        for a, r in zip(g_api, g_rec, strict=True):
            assert a is not None and r is not None
            if a.kernel != SGEMM:
                assert a.source != "api"
                continue
            assert a.source == "api" and r.source == "replay"
            assert set(a.extents) == set(r.extents)
            for key in a.extents:
                base = view.allocs[key[1]].addr
                assert pages(a.extents[key], base) == pages(r.extents[key], base), (a.node, key)
            checked += 1
    assert checked >= 10


def pages(extents, base):  # type: ignore[no-untyped-def]
    """Page number -> READ|WRITE flags (a page whose first access was a write: WRITE only, as
    simcuda records it, so reads of written pages are left out)."""
    out: dict[int, int] = {}
    for lo, hi, mode in extents:
        for p in range((base + lo) // 4096, -(-(base + hi) // 4096)):
            out[p] = out.get(p, 0) | mode
    return {p: m & WRITE or m for p, m in out.items()}
