"""Model files the engine cannot run are refused with the file, the reason and the fix: missing,
not GGUF or safetensors, cut short, an unknown or undequantizable type, a wrong shape."""

from __future__ import annotations

import json
import struct

import pytest
from gguf import GGMLQuantizationType as T

from medusa.engine.loader import open_model
from medusa.engine.loader.gguf_file import GGUFFile
from medusa.engine.model_error import ModelError
from tests.engine.tiny_models import write_gguf, write_hf


def _gguf(path, kv: dict[str, str | int], tensors: list[tuple[str, tuple[int, ...], int]]) -> None:
    """A GGUF file by hand (gguf's writer refuses to write the broken ones), zeros for data."""

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


def test_unsupported_architecture_and_types_are_named(tmp_path):
    f = tmp_path / "gpt.gguf"
    _gguf(f, {"general.architecture": "gpt2"}, [])
    with pytest.raises(ModelError, match="architecture 'gpt2' is not supported"):
        open_model(f)
    q = tmp_path / "q8k.gguf"
    _gguf(q, {"general.architecture": "llama"}, [("w", (256, 4), T.Q8_K)])
    with pytest.raises(ModelError, match="tensor w is Q8_K, which gguf .* cannot dequantize; con"):
        GGUFFile(q).load("w")
    with pytest.raises(ModelError, match="llama.embedding_length is missing"):
        open_model(q)
    u = tmp_path / "future.gguf"
    _gguf(u, {"general.architecture": "llama"}, [("w", (256, 4), 99)])
    with pytest.raises(ModelError, match="future.gguf: tensor w has ggml type 99, which gguf"):
        open_model(u)


def test_files_that_are_not_gguf_are_refused(tmp_path):
    f = tmp_path / "x.gguf"
    f.write_bytes(b"PK\x03\x04 not a model")
    with pytest.raises(ModelError, match="not a GGUF file"):
        open_model(f)
    with pytest.raises(ModelError, match="no such GGUF file"):
        GGUFFile(tmp_path / "missing.gguf")


def test_a_cut_short_gguf_file_names_the_tensor_or_the_header(tmp_path):
    f = tmp_path / "tiny.gguf"
    write_gguf(f, [T.Q4_K])
    data = f.read_bytes()
    f.write_bytes(data[:-1000])
    with pytest.raises(ModelError, match="tensor output.weight runs past the end of the file .* "
                       "download it again"):  # fmt: skip
        open_model(f)
    f.write_bytes(data[:600])
    with pytest.raises(ModelError, match="tiny.gguf: the GGUF header is damaged or cut short"):
        open_model(f)


def test_a_gguf_tensor_of_the_wrong_shape_is_named(tmp_path):
    f = tmp_path / "tiny.gguf"
    write_gguf(f, [T.Q8_0], {"feed_forward_length": 768})
    with pytest.raises(ModelError, match="tensor blk.0.ffn_gate.weight has shape \\(512, 256\\), "
                       "its metadata makes it \\(768, 256\\)"):  # fmt: skip
        dict(open_model(f).weights())


def test_broken_safetensors_checkpoints_are_named(tmp_path):
    d = tmp_path / "hf"
    write_hf(d, {})
    shard = d / "model-00001-of-00002.safetensors"
    data = shard.read_bytes()
    shard.write_bytes(data[:-10])
    with pytest.raises(ModelError, match="00001-of-00002.safetensors: not a safetensors file"):
        open_model(d)
    shard.write_bytes(data)
    (d / "config.json").write_text(
        json.dumps(json.loads((d / "config.json").read_text()) | {"intermediate_size": 768})
    )
    with pytest.raises(ModelError, match="gate_proj.weight has shape \\(512, 256\\), config.json"):
        dict(open_model(d).weights())
    cfg = json.loads((d / "config.json").read_text())
    del cfg["hidden_size"]
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelError, match="config.json: hidden_size is missing"):
        open_model(d)
