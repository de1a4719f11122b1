"""GGUF files the engine cannot run are refused with the file, the reason and the fix."""

from __future__ import annotations

import struct

import pytest

from medusa.engine.loader import open_model
from medusa.engine.loader.errors import ModelError
from medusa.engine.loader.gguf_file import GGUFFile


def _gguf(path, kv: dict[str, str | int], tensors: list[tuple[str, tuple[int, ...], int]]) -> None:
    def s(x: str) -> bytes:
        return struct.pack("<Q", len(x)) + x.encode()

    out = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kv))
    for k, v in kv.items():
        out += s(k) + (
            struct.pack("<I", 8) + s(v) if isinstance(v, str) else struct.pack("<II", 4, v)
        )
    for name, dims, t in tensors:
        out += s(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
        out += struct.pack("<IQ", t, 0)
    out += b"\0" * (-len(out) % 32) + b"\0" * 4096
    path.write_bytes(out)


def test_unsupported_architecture_and_quantization_are_named(tmp_path):
    f = tmp_path / "gpt.gguf"
    _gguf(f, {"general.architecture": "gpt2"}, [])
    with pytest.raises(ModelError, match="architecture 'gpt2' is not supported"):
        open_model(f)
    q = tmp_path / "q4k.gguf"
    _gguf(q, {"general.architecture": "llama"}, [("w", (256, 4), 12)])
    with pytest.raises(ModelError, match="tensor w is Q4_K; this engine reads F32, F16, Q4_1"):
        GGUFFile(q).load("w")
    with pytest.raises(ModelError, match="llama.embedding_length is missing"):
        open_model(q)


def test_files_that_are_not_gguf_are_refused(tmp_path):
    f = tmp_path / "x.gguf"
    f.write_bytes(b"PK\x03\x04 not a model")
    with pytest.raises(ModelError, match="not a GGUF file"):
        open_model(f)
    with pytest.raises(ModelError, match="no such GGUF file"):
        GGUFFile(tmp_path / "missing.gguf")
