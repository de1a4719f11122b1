"""The staging-ring loader: what lands on the device is the store's bytes, a bad chunk stops the
load naming it, and arrays from a model file take the same slots."""

from __future__ import annotations

import numpy as np
import pytest

from medusa.engine.device import Device
from medusa.weights import WeightStoreError, open_store, write_store
from medusa.weights.format import MIN_CHUNK
from medusa.weights.loader import StagingRing


@pytest.fixture(scope="module")
def device():
    return Device()


def _store(tmp_path, seed=0):
    rng = np.random.default_rng(seed)
    shapes = {"a": (513, 77), "b": (64,), "c": (1024, 300), "d": (3,)}
    arrays = {n: rng.standard_normal(s).astype(np.float32) for n, s in shapes.items()}
    path = tmp_path / "w.store"
    write_store(path, list(shapes.items()), iter(arrays.items()), {}, chunk_size=MIN_CHUNK)
    return path, arrays


@pytest.mark.parametrize("workers", [1, 3])
def test_the_device_gets_the_stores_bytes(tmp_path, device, workers):
    path, arrays = _store(tmp_path)
    bufs = {n: device.alloc(a.nbytes) for n, a in arrays.items()}
    with open_store(path) as store, StagingRing(device.b, device.stream, workers=workers) as ring:
        ring.load_store(store, {n: b.ptr for n, b in bufs.items() if n != "c"})
    for name, arr in arrays.items():
        if name != "c":  # not asked for (a host-resident weight): checked, not copied
            got = device.download(bufs[name], np.float32, arr.size)
            assert np.array_equal(got, arr.reshape(-1)), name
    for b in bufs.values():
        device.free(b)


def test_a_bad_chunk_stops_the_load_naming_it(tmp_path, device):
    path, arrays = _store(tmp_path)
    with open_store(path) as store:
        at = store.header.data_offset + store.tensors["c"].offset + 2 * MIN_CHUNK
        chunk = (store.tensors["c"].offset + 2 * MIN_CHUNK) // MIN_CHUNK
    raw = bytearray(path.read_bytes())
    raw[at] ^= 1
    path.write_bytes(raw)
    bufs = {n: device.alloc(a.nbytes) for n, a in arrays.items()}
    with open_store(path) as store, StagingRing(device.b, device.stream, workers=2) as ring:
        with pytest.raises(WeightStoreError, match=rf"chunk {chunk} of .*\bc\b"):
            ring.load_store(store, {n: b.ptr for n, b in bufs.items()})
    for b in bufs.values():
        device.free(b)


def test_arrays_pass_through_the_same_slots(device):
    arr = np.random.default_rng(1).standard_normal(3_000_000).astype(np.float32)  # 3 slots' worth
    buf = device.alloc(arr.nbytes)
    with StagingRing(device.b, device.stream) as ring:
        ring.upload(buf.ptr, arr)
        ring.synchronize()
    assert np.array_equal(device.download(buf, np.float32, arr.size), arr)
    device.free(buf)


def test_the_progress_watermark_covers_checked_chunks_only(tmp_path, device):
    """A load's waiters get the bytes below a bad chunk, and that chunk's index for any beyond."""
    import threading

    from medusa.weights.loader import LoadProgress

    path, arrays = _store(tmp_path)
    bad = 5
    raw = bytearray(path.read_bytes())
    with open_store(path) as store:
        raw[store.header.data_offset + bad * MIN_CHUNK + 7] ^= 1
    path.write_bytes(raw)
    bufs = {n: device.alloc(a.nbytes) for n, a in arrays.items()}
    with open_store(path) as store, StagingRing(device.b, device.stream, workers=2) as ring:
        progress = LoadProgress(store.header, hold=bad)
        errors: list[BaseException] = []

        def run() -> None:
            try:
                ring.load_store(store, {n: b.ptr for n, b in bufs.items()}, progress=progress)
            except WeightStoreError as e:
                errors.append(e)

        load = threading.Thread(target=run)
        load.start()
        assert progress.wait(bad * MIN_CHUNK) == (0, 0)  # the chunks below the hold
        assert progress.num_done == bad
        progress.release()
        assert progress.wait(bad * MIN_CHUNK + 1) == (1, bad)
        assert progress.wait(bad * MIN_CHUNK) == (0, 0)
        load.join()
        progress.close()
    assert f"chunk {bad} of" in str(errors[0])
    stopped = LoadProgress(store.header)
    stopped.stop()  # a load that never ran: its waiters are not left blocked
    assert stopped.wait(1) == (2, 0)
    stopped.close()
    for b in bufs.values():
        device.free(b)
