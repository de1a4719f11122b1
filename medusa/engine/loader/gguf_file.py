"""A small GGUF reader: metadata, tensor table, and float32 dequantization of F32, F16, BF16,
Q8_0 and Q4_1 tensors with numpy. The file is memory-mapped; nothing is read twice."""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from medusa.engine.loader.errors import ModelError

MAGIC = b"GGUF"
# ggml tensor types this reader dequantizes: name, block size (weights), bytes per block.
TYPES: dict[int, tuple[str, int, int]] = {
    0: ("F32", 1, 4),
    1: ("F16", 1, 2),
    3: ("Q4_1", 32, 20),
    8: ("Q8_0", 32, 34),
    30: ("BF16", 1, 2),
}
GGML_NAMES = {2: "Q4_0", 6: "Q5_0", 7: "Q5_1", 10: "Q2_K", 11: "Q3_K", 12: "Q4_K", 13: "Q5_K",
              14: "Q6_K", 15: "Q8_K"}  # fmt: skip
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q",
            11: "<q", 12: "<d"}  # fmt: skip


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # numpy order (slowest first)
    ggml_type: int
    offset: int  # absolute file offset

    @property
    def type_name(self) -> str:
        known = TYPES.get(self.ggml_type)
        return known[0] if known else GGML_NAMES.get(self.ggml_type, f"type {self.ggml_type}")


class _Cursor:
    def __init__(self, buf: memoryview, path: Path) -> None:
        self.buf, self.pos, self.path = buf, 0, path

    def take(self, fmt: str) -> Any:
        try:
            (v,) = struct.unpack_from(fmt, self.buf, self.pos)
        except struct.error:
            raise ModelError(f"{self.path}: GGUF header is cut short at byte {self.pos}") from None
        self.pos += struct.calcsize(fmt)
        return v

    def string(self) -> str:
        n = self.take("<Q")
        s = bytes(self.buf[self.pos : self.pos + n])
        self.pos += n
        return s.decode("utf-8", "replace")

    def value(self, vtype: int) -> Any:
        if vtype == 8:
            return self.string()
        if vtype == 9:
            etype, n = self.take("<I"), self.take("<Q")
            if etype == 8:
                return [self.string() for _ in range(n)]
            fmt = _SCALARS[etype]
            arr = np.frombuffer(self.buf, np.dtype(fmt), count=n, offset=self.pos)
            self.pos += n * arr.itemsize
            return arr
        if vtype not in _SCALARS:
            raise ModelError(f"{self.path}: unknown GGUF value type {vtype} at byte {self.pos}")
        return self.take(_SCALARS[vtype])


class GGUFFile:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise ModelError(f"{self.path}: no such GGUF file")
        self.data = np.memmap(self.path, dtype=np.uint8, mode="r")
        buf = memoryview(self.data)
        if bytes(buf[:4]) != MAGIC:
            raise ModelError(f"{self.path}: not a GGUF file (starts with {bytes(buf[:4])!r})")
        c = _Cursor(buf, self.path)
        c.pos = 4
        version, n_tensors, n_kv = c.take("<I"), c.take("<Q"), c.take("<Q")
        if version not in (2, 3):
            raise ModelError(f"{self.path}: GGUF version {version}; versions 2 and 3 are read")
        self.metadata: dict[str, Any] = {}
        for _ in range(n_kv):
            key = c.string()
            self.metadata[key] = c.value(c.take("<I"))
        infos = []
        for _ in range(n_tensors):
            name = c.string()
            dims = [c.take("<Q") for _ in range(c.take("<I"))]
            infos.append((name, tuple(reversed(dims)), c.take("<I"), c.take("<Q")))
        align = int(self.metadata.get("general.alignment", 32))
        start = (c.pos + align - 1) // align * align
        self.tensors = {n: TensorInfo(n, s, t, start + o) for n, s, t, o in infos}

    def get(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(key, default)

    def load(self, name: str) -> np.ndarray:
        """The tensor as float32, in numpy order."""
        info = self.tensors.get(name)
        if info is None:
            raise ModelError(f"{self.path}: no tensor {name!r}")
        if info.ggml_type not in TYPES:
            raise ModelError(
                f"{self.path}: tensor {name} is {info.type_name}; this engine reads "
                f"{', '.join(t[0] for t in TYPES.values())} (convert the model to one of them)"
            )
        _, block, nbytes = TYPES[info.ggml_type]
        count = int(np.prod(info.shape))
        raw = self.data[info.offset : info.offset + count // block * nbytes]
        if raw.size * block != count * nbytes:
            raise ModelError(f"{self.path}: tensor {name} runs past the end of the file")
        return _dequantize(info.ggml_type, raw, count).reshape(info.shape)


def _dequantize(ggml_type: int, raw: np.ndarray, count: int) -> np.ndarray:
    if ggml_type == 0:
        return raw.view("<f4").copy()
    if ggml_type == 1:
        return raw.view("<f2").astype(np.float32)
    if ggml_type == 30:
        return (raw.view("<u2").astype(np.uint32) << 16).view(np.float32)
    if ggml_type == 8:  # Q8_0: f16 scale, 32 x int8
        blocks = raw.reshape(-1, 34)
        d = blocks[:, :2].copy().view("<f2").astype(np.float32)
        q = blocks[:, 2:].view(np.int8).astype(np.float32)
        return (q * d).reshape(count)
    # Q4_1: f16 scale, f16 min, 16 bytes: low nibbles are weights 0-15, high nibbles 16-31
    blocks = raw.reshape(-1, 20)
    dm = blocks[:, :4].copy().view("<f2").astype(np.float32)
    qs = blocks[:, 4:]
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=1).astype(np.float32)
    return (q * dm[:, :1] + dm[:, 1:2]).reshape(count)
