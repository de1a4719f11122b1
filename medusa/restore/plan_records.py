"""Reading a plan's tables safely: records from blobs that must hold whole records, lists of
objects with exactly the expected fields, and the first bad row named (medusa.restore.graph_check
and validate use them)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from medusa.artifact.errors import ArtifactError

I64 = 1 << 63
MAX_TABLE = 1 << 24  # entries in any one plan table


def records(blobs: list[bytes], dtype: np.dtype, where: str) -> tuple[np.ndarray, np.ndarray]:
    """The blobs' records, concatenated, and how many each blob holds."""
    sizes = np.array([len(b) for b in blobs], np.int64)
    bad = np.flatnonzero(sizes % dtype.itemsize)
    if bad.size:
        raise ArtifactError(f"{where.format(bad[0])}: not a whole number of records")
    return np.frombuffer(b"".join(blobs), dtype), sizes // dtype.itemsize


def entries(value: Any, where: str, fields: Mapping[str, type]) -> list[dict[str, Any]]:
    """A list of objects with exactly these fields, of these types; integers within int64 (numpy
    takes them next: a larger one would raise OverflowError, not the project's error)."""
    if type(value) is not list or len(value) > MAX_TABLE:
        raise ArtifactError(f"{where}: expected a list")
    for i, v in enumerate(value):
        if type(v) is not dict or v.keys() != fields.keys():
            raise ArtifactError(f"{where}[{i}]: expected an object with fields {list(fields)}")
        for k, t in fields.items():
            if type(v[k]) is not t or (t is int and not -I64 <= v[k] < I64):
                raise ArtifactError(f"{where}[{i}].{k}: expected {t.__name__}")
    return value  # type: ignore[no-any-return]


def one_of(a: np.ndarray, values: tuple[int, ...]) -> np.ndarray:
    out = np.zeros(a.shape, bool)  # NOTE: not np.isin: its first call imports numpy.ma (13 ms)
    for v in values:
        out |= a == v
    return out


def raise_first(bad: np.ndarray, name: Callable[[int], str], what: str) -> None:
    hit = np.flatnonzero(bad)
    if hit.size:
        raise ArtifactError(f"{name(int(hit[0]))}: {what}")
