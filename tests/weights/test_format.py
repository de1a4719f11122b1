"""The weight store's file: what is written reads back, and a damaged, cut-short or foreign file
is refused naming the file (and, for data, the chunk and its tensors)."""

from __future__ import annotations

import numpy as np
import pytest

from medusa.weights import WeightStoreError, open_store, write_store
from medusa.weights.format import ALIGNMENT, MIN_CHUNK


def _tensors(seed: int = 0) -> list[tuple[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    shapes = {"embed": (300, 64), "norm": (64,), "proj": (640, 256), "bias": (7,)}
    return [(n, rng.standard_normal(s).astype(np.float32)) for n, s in shapes.items()]


def _write(path, tensors=None, **kw):
    tensors = tensors or _tensors()
    shapes = [(n, a.shape) for n, a in tensors]
    return write_store(path, shapes, iter(tensors), {"identity": "test:1", "name": "t"}, **kw)


def test_tensors_read_back_aligned_and_every_chunk_checks(tmp_path):
    path = tmp_path / "w.store"
    info = _write(path, chunk_size=MIN_CHUNK)
    with open_store(path, digest=info["header_sha256"]) as store:
        assert store.nbytes == path.stat().st_size == info["size"]
        assert store.header.num_chunks == info["chunks"] > 4
        for name, arr in _tensors():
            t = store.tensors[name]
            assert (store.header.data_offset + t.offset) % ALIGNMENT == 0
            assert np.array_equal(store.array(t), arr)
        store.verify()
        assert store.model["identity"] == "test:1"


def test_the_tokenizer_record_reads_back_apart_from_the_model(tmp_path):
    path = tmp_path / "w.store"
    tok = {"kind": "json", "json": "{}", "eos_ids": [2], "chat_template": None}
    tensors = _tensors()
    model = {"identity": "test:1", "name": "t", "tokenizer": tok}
    write_store(path, [(n, a.shape) for n, a in tensors], iter(tensors), model)
    with open_store(path) as store:
        assert "tokenizer" not in store.model and store.model["identity"] == "test:1"
        assert store.tokenizer_record() == tok


def test_a_store_without_a_usable_tokenizer_record_says_so_when_asked(tmp_path):
    path = tmp_path / "w.store"
    _write(path)  # no tokenizer: its record is JSON null
    with open_store(path) as store, pytest.raises(WeightStoreError) as e:
        store.tokenizer_record()
    assert "tokenizer record is not usable" in str(e.value) and str(path) in str(e.value)


def test_a_flipped_data_byte_is_found_in_its_chunk_named_with_its_tensor(tmp_path):
    path = tmp_path / "w.store"
    _write(path, chunk_size=MIN_CHUNK)
    with open_store(path) as store:
        t = store.tensors["proj"]
        at = store.header.data_offset + t.offset + 3 * MIN_CHUNK + 5
        chunk = (t.offset + 3 * MIN_CHUNK + 5) // MIN_CHUNK
    data = bytearray(path.read_bytes())
    data[at] ^= 0x40
    path.write_bytes(data)
    with open_store(path) as store, pytest.raises(WeightStoreError) as e:
        store.verify()
    assert f"chunk {chunk} of" in str(e.value) and "proj" in str(e.value)
    assert str(path) in str(e.value)


@pytest.mark.parametrize(
    "damage, expect",
    [
        (lambda b: b[:100], "cut short"),
        (lambda b: b[:-10], "truncated"),
        (lambda b: b"NOTASTORE" + b[9:], "wrong magic"),
        (lambda b: b[:60] + bytes([b[60] ^ 1]) + b[61:], "header's own checksum"),
        (lambda b: b[:8] + (7).to_bytes(4, "little") + b[12:], "format 7"),
    ],
)
def test_a_damaged_header_is_refused_naming_the_file(tmp_path, damage, expect):
    path = tmp_path / "w.store"
    _write(path)
    path.write_bytes(damage(path.read_bytes()))
    with pytest.raises(WeightStoreError) as e:
        open_store(path)
    assert expect in str(e.value) and str(path) in str(e.value)


def test_a_store_whose_header_is_not_the_sealed_one_is_refused(tmp_path):
    a, b = tmp_path / "a.store", tmp_path / "b.store"
    info = _write(a)
    _write(b, _tensors(seed=1))
    open_store(a, digest=info["header_sha256"]).close()
    b.replace(a)
    with pytest.raises(WeightStoreError, match="not the one the artifact's manifest seals"):
        open_store(a, digest=info["header_sha256"])


def test_missing_and_linked_stores_are_refused(tmp_path):
    with pytest.raises(WeightStoreError, match="missing"):
        open_store(tmp_path / "none.store")
    _write(tmp_path / "real.store")
    (tmp_path / "link.store").symlink_to(tmp_path / "real.store")
    with pytest.raises(WeightStoreError, match="symbolic link"):
        open_store(tmp_path / "link.store")


def test_tensors_out_of_order_or_shape_are_refused_while_writing(tmp_path):
    tensors = _tensors()
    shapes = [(n, a.shape) for n, a in tensors]
    with pytest.raises(ValueError, match="expects norm"):
        write_store(tmp_path / "w.store", shapes, iter([tensors[0], tensors[2]]), {})
    assert not list(tmp_path.iterdir())  # no half-written file is left
