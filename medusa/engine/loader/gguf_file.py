"""A GGUF file read with the gguf package (llama.cpp's own): metadata as plain values, the tensor
table, and float32 dequantization of every type gguf.quants knows (F32, F16, BF16, Q4_0 ... Q8_0,
the K-quants, the IQ types). The file is memory-mapped; a tensor is read when it is loaded."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path
from typing import Any

import gguf
import numpy as np

from medusa.engine.model_error import ModelError

MAGIC = b"GGUF"
CONVERT = "convert the model to Q4_K_M, Q8_0 or F16"


def _gguf_version() -> str:
    return importlib.metadata.version("gguf")


class _Reader(gguf.GGUFReader):
    """GGUFReader, with each tensor checked before it is mapped: GGUFReader itself fails on an
    unknown type or a cut-short file with an error that names neither the tensor nor the file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        super().__init__(path)

    def _get_field_parts(
        self, orig_offs: int, raw_type: int
    ) -> tuple[int, list[np.ndarray], list[int], list[gguf.GGUFValueType]]:
        # NOTE: GGUFReader reads an array one element at a time, each a memmap view: seconds for
        # a 50k-token vocabulary. Arrays of strings and of numbers are read here in one pass (a
        # numeric array as one part, which ReaderField.contents() reads whole too); anything else
        # goes to GGUFReader.
        kind = gguf.GGUFValueType
        if raw_type != kind.ARRAY or self.byte_order != "I":
            return super()._get_field_parts(orig_offs, raw_type)
        head, count = self._get(orig_offs, np.uint32), self._get(orig_offs + 4, np.uint64)
        sub, n, offs = int(head[0]), int(count[0]), orig_offs + 12
        types = [kind.ARRAY, kind(sub)] if n else [kind.ARRAY]
        if sub in self.gguf_scalar_to_np:
            values = self._get(offs, self.gguf_scalar_to_np[kind(sub)], n)
            if len(values) != n:
                raise ValueError(f"an array runs past the end of the file at byte {offs}")
            return 12 + values.nbytes, [head, count, values], [2], types
        if sub != kind.STRING:
            return super()._get_field_parts(orig_offs, raw_type)
        buf = self.data.view(np.ndarray)
        raw = memoryview(buf.data)
        parts: list[np.ndarray] = [head, count]
        for _ in range(n):
            end = offs + 8 + int.from_bytes(raw[offs : offs + 8], "little")
            if end > len(buf):
                raise ValueError(f"a string array runs past the end of the file at byte {offs}")
            parts += [buf[offs : offs + 8], buf[offs + 8 : end]]  # length (8 bytes), text
            offs = end
        return offs - orig_offs, parts, list(range(3, len(parts), 2)), types

    def _build_tensors(self, start_offs: int, fields: list[gguf.ReaderField]) -> None:
        # NOTE: a tensor-info field's parts are (name length, name, n_dims, dims, type, offset),
        # as GGUFReader._get_tensor_info_field builds them.
        for field in fields:
            dims, raw_type, offset = field.parts[3], int(field.parts[4][0]), int(field.parts[5][0])
            try:
                qtype = gguf.GGMLQuantizationType(raw_type)
            except ValueError:
                raise ModelError(
                    f"{self.path}: tensor {field.name} has ggml type {raw_type}, which gguf "
                    f"{_gguf_version()} does not know; pip install -U gguf, or {CONVERT}"
                ) from None
            block, size = gguf.GGML_QUANT_SIZES[qtype]
            end = start_offs + offset + int(np.prod(dims, dtype=np.int64)) // block * size
            if end > len(self.data):
                raise ModelError(
                    f"{self.path}: tensor {field.name} runs past the end of the file (to byte "
                    f"{end} of {len(self.data)}): the file is cut short; download it again"
                )
        super()._build_tensors(start_offs, fields)


class GGUFFile:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise ModelError(f"{self.path}: no such GGUF file")
        with self.path.open("rb") as f:
            head = f.read(4)
        if head != MAGIC:
            raise ModelError(f"{self.path}: not a GGUF file (starts with {head!r})")
        try:
            reader = _Reader(self.path)
        except ModelError:
            raise
        except (ValueError, IndexError, KeyError, OverflowError) as e:
            raise ModelError(
                f"{self.path}: the GGUF header is damaged or cut short ({e}); download the file "
                f"again (or, for a newer GGUF version, pip install -U gguf)"
            ) from None
        self.data = reader.data
        self.metadata: dict[str, Any] = {
            k: _value(f) for k, f in reader.fields.items() if not k.startswith("GGUF.")
        }
        self.tensors = {t.name: t for t in reader.tensors}

    def get(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(key, default)

    @property
    def data_start(self) -> int:
        """Where the first tensor's data begins: what precedes it is the header."""
        return min((t.data_offset for t in self.tensors.values()), default=len(self.data))

    def type_name(self, name: str) -> str:
        return self.tensors[name].tensor_type.name

    def load(self, name: str) -> np.ndarray:
        """The tensor as float32, in numpy order (slowest dimension first)."""
        t = self.tensors.get(name)
        if t is None:
            raise ModelError(f"{self.path}: no tensor {name!r}")
        try:
            w = _dequantize(np.asarray(t.data), t.tensor_type)
        except NotImplementedError:
            raise ModelError(
                f"{self.path}: tensor {name} is {t.tensor_type.name}, which gguf "
                f"{_gguf_version()} cannot dequantize; {CONVERT}"
            ) from None
        return np.asarray(w, dtype=np.float32)


def _dequantize(data: np.ndarray, qtype: gguf.GGMLQuantizationType) -> np.ndarray:
    """gguf.quants.dequantize, by chunks of about a megabyte: gguf's own goes 16 rows at a time,
    which takes twice as long on a model's many small tensors. data is a plain ndarray: numpy's
    per-operation hooks on the memmap subclass would slow every step."""
    codec: Any = getattr(gguf.quants, qtype.name, None)
    if data.dtype != np.uint8 or not hasattr(codec, "dequantize_rows"):
        return gguf.quants.dequantize(data, qtype)  # F32, F16 (views) or a type it refuses
    codec.init_grid()  # the IQ types' lookup tables
    rows = data.reshape(-1, data.shape[-1])
    out = np.empty((len(rows), rows.shape[1] // codec.type_size * codec.block_size), np.float32)
    step = max(1, (1 << 20) // rows.shape[1])
    for i in range(0, len(rows), step):
        out[i : i + step] = codec.dequantize_rows(rows[i : i + step])
    return out.reshape(*data.shape[:-1], out.shape[1])


def _value(field: gguf.ReaderField) -> Any:
    """A metadata value: str, int, float, bool, list[str], or a numpy array for a numeric array."""
    kind = field.types[0]
    if kind == gguf.GGUFValueType.STRING:
        return bytes(field.parts[-1]).decode("utf-8", "replace")
    if kind != gguf.GGUFValueType.ARRAY:
        return field.parts[-1][0].item()
    if len(field.types) < 2:  # an empty array records no element type
        return []
    if field.types[1] == gguf.GGUFValueType.STRING:
        return [field.parts[i].tobytes().decode("utf-8", "replace") for i in field.data]
    return np.concatenate([field.parts[i] for i in field.data])
