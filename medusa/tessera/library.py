"""Library kernels' accesses by their API semantics: what a GEMM reads and writes follows from the
arguments of the call (shapes, leading dimensions, transposes, beta), which the captured kernel
node carries; no instrumentation of the library's code is needed (on a GPU, a closed library's
kernels cannot be rewritten in PTX). Byte-exact where instrumentation gives pages.

Covered: our mblas GEMM (`mblas_sgemm`, whose kernel takes the call's arguments unchanged).
cuBLAS's kernels take internal parameters: those need the call recorded by the interposer."""

from __future__ import annotations

import struct
from collections.abc import Callable

from medusa.tessera.modes import READ, WRITE

Span = tuple[int, int, int]  # (lo, hi, READ|WRITE), device addresses


def _matrix(ptr: int, rows: int, cols: int, ld: int, elem: int) -> tuple[int, int] | None:
    """The bytes a row-major rows x cols matrix with leading dimension ld spans."""
    if rows <= 0 or cols <= 0 or not ptr:
        return None
    return ptr, ptr + ((rows - 1) * ld + cols) * elem


def mblas_sgemm(args: list[int | float]) -> list[Span]:
    """C[m x n] = alpha * op(A)[m x k] * op(B)[k x n] + beta * C, row-major float32."""
    ta, tb, m, n, k, _alpha, a, lda, b, ldb, beta, c, ldc = args
    out: list[Span] = []
    for ptr, rows, cols, ld, mode in (
        (a, k if ta else m, m if ta else k, lda, READ),
        (b, n if tb else k, k if tb else n, ldb, READ),
        (c, m, n, ldc, WRITE | (READ if beta != 0.0 else 0)),
    ):
        span = _matrix(int(ptr), int(rows), int(cols), int(ld), 4)
        if span is not None:
            out.append((*span, mode))
    return out


# kernel name -> (parameter kinds as the kernel declares them, extents from the arguments)
KERNELS: dict[str, tuple[str, Callable[[list[int | float]], list[Span]]]] = {
    "_ZN5mblas12sgemm_rm_f32EiiiiifPKfiS1_ifPfi": ("iiiiifpipifpi", mblas_sgemm),
}
_FORMATS = {"i": "<i", "f": "<f", "p": "<Q"}


def api_extents(kernel: str, params: bytes, layout: list[tuple[int, int]]) -> list[Span] | None:
    """A library kernel node's extents from its arguments; None for a kernel not covered (or
    parameters that do not match its declaration)."""
    known = KERNELS.get(kernel)
    if known is None:
        return None
    kinds, rule = known
    if len(layout) != len(kinds):
        return None
    args: list[int | float] = []
    for (off, size), kind in zip(layout, kinds, strict=True):
        fmt = _FORMATS[kind]
        if size != struct.calcsize(fmt) or off + size > len(params):
            return None
        args.append(struct.unpack_from(fmt, params, off)[0])
    return rule(args)
