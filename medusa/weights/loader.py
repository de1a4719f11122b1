"""Copying weights to the device through a ring of pinned staging slots, several chunks in flight.

A worker takes a free slot (waiting for the event of its last copy), copies a chunk of the store
into it, checks the chunk's checksum on the staged bytes (the bytes that are sent, still in the
CPU's cache), then queues a cudaMemcpyAsync per tensor piece and records the slot's event. For a
store the workers are C threads (csrc/restore/chunk_loader.c): the whole load is one call that
releases the GIL, so the engine runs it beside its other start-up stages. Arrays from a model file
take the same slots, so a start-up allocates the same whatever its weights come from (a restored
graph's allocation check sees no difference)."""

from __future__ import annotations

import ctypes
import functools
import os
from ctypes import byref, c_int, c_size_t, c_uint, c_void_p
from dataclasses import dataclass
from typing import Any

import numpy as np

from medusa.cuda import CudaError
from medusa.cuda.backend import Backend
from medusa.cuda.native import restore_library
from medusa.weights.errors import WeightStoreError
from medusa.weights.format import MAX_CHUNK, Header
from medusa.weights.progress import LoadProgress
from medusa.weights.store import WeightStore

# NOTE: fixed, not derived from the machine: the slots are recorded allocations, and a restore on
# a machine with another core count must allocate what the recording did.
SLOTS = 4
SLOT_BYTES = MAX_CHUNK
H2D = 1
EVENT_DISABLE_TIMING = 2


@dataclass(frozen=True)
class Piece:
    dst: int  # device address
    src: int  # offset in the chunk
    nbytes: int


PIECE = np.dtype([("dst", "<u8"), ("src", "<u8"), ("nbytes", "<u8")])  # mr_piece


class _Load(ctypes.Structure):  # mr_load in csrc/restore/restore.h
    _fields_ = [
        ("data", c_void_p),
        ("data_size", ctypes.c_uint64),
        ("chunk_size", ctypes.c_uint64),
        ("num_chunks", ctypes.c_uint32),
        ("digests", c_void_p),
        ("piece_start", c_void_p),
        ("pieces", c_void_p),
        ("slots", ctypes.POINTER(c_void_p)),
        ("events", ctypes.POINTER(c_void_p)),
        ("num_slots", ctypes.c_uint32),
        ("slot_bytes", ctypes.c_uint64),
        ("stream", c_void_p),
        ("workers", ctypes.c_uint32),
        ("progress", c_void_p),
        ("fd", ctypes.c_int32),
        ("file_offset", ctypes.c_uint64),
    ]


@functools.cache
def _chunk_loader() -> Any:
    fn = restore_library().mr_load_chunks
    fn.restype = c_int
    fn.argtypes = [ctypes.POINTER(_Load), ctypes.POINTER(ctypes.c_uint32), ctypes.c_char_p,
                   c_size_t]  # fmt: skip
    return fn


def _pieces(h: Header, dsts: dict[str, int]) -> tuple[np.ndarray, np.ndarray]:
    """Per chunk, the runs of it that go to the device: chunk i has pieces[start[i]:start[i+1]]."""
    tensors = [t for t in h.tensors if t.name in dsts]
    starts, out = [0], []
    k = 0
    for i in range(h.num_chunks):
        lo, hi = h.chunk_range(i)
        while k < len(tensors) and tensors[k].end <= lo:
            k += 1
        for t in tensors[k:]:
            if t.offset >= hi:
                break
            a, b = max(t.offset, lo), min(t.end, hi)
            if a < b:
                out.append((dsts[t.name] + a - t.offset, a - lo, b - a))
        starts.append(len(out))
    return np.array(starts, np.uint64), np.array(out or [(0, 0, 0)], PIECE)


def _check_load(store: WeightStore, code: int, i: int, why: str) -> None:
    """Raises for what mr_load_chunks returned: chunk I bad (1) or unreadable (4), or WHY."""
    n = store.header.num_chunks
    if code == 1:
        raise WeightStoreError(
            f"{store.path}: chunk {i} of {n} ({store.describe_chunk(i)}) does not "
            "match its checksum (corrupted); materialize again to rewrite the store"
        )
    if code == 4:
        raise WeightStoreError(
            f"{store.path}: chunk {i} of {n} could not be read: {why} (the file "
            "was changed while in use?); materialize again to rewrite the store"
        )
    if code:
        raise RuntimeError(f"loading {store.path}: {why}")


class _Runtime:
    """The runtime calls the ring makes, prototyped once (a handle of its own, so no one else's
    argtypes change)."""

    def __init__(self, b: Backend) -> None:
        self.b = b
        scope = ctypes.CDLL(None)
        p = ctypes.POINTER(c_void_p)
        self.fns = {}
        for name, args in {
            "cudaHostAlloc": [p, c_size_t, c_uint],
            "cudaFreeHost": [c_void_p],
            "cudaEventCreateWithFlags": [p, c_uint],
            "cudaEventRecord": [c_void_p, c_void_p],
            "cudaEventSynchronize": [c_void_p],
            "cudaEventDestroy": [c_void_p],
            "cudaMemcpyAsync": [c_void_p, c_void_p, c_size_t, c_int, c_void_p],
            "cudaStreamSynchronize": [c_void_p],
        }.items():
            f = getattr(scope, name)
            f.restype, f.argtypes = c_int, args
            self.fns[name] = f

    def __call__(self, name: str, *args: object) -> None:
        code = self.fns[name](*args)
        if code:
            raise CudaError(name, code, self.b.error_name(code), self.b.last_message())


class StagingRing:
    def __init__(self, backend: Backend, stream: int, *, workers: int | None = None) -> None:
        self.rt = _Runtime(backend)
        self.stream = stream
        self.workers = workers or max(1, min(SLOTS // 2, os.cpu_count() or 1))
        self.slots: list[int] = []
        self.events: list[int] = []
        self._pending = [False] * SLOTS
        self._next = 0  # the slot upload() takes next
        self._views: list[np.ndarray] = []
        try:
            for _ in range(SLOTS):
                h = c_void_p()
                self.rt("cudaHostAlloc", byref(h), SLOT_BYTES, 0)
                self.slots.append(int(h.value or 0))
                ev = c_void_p()
                self.rt("cudaEventCreateWithFlags", byref(ev), EVENT_DISABLE_TIMING)
                self.events.append(int(ev.value or 0))
                buf = (ctypes.c_uint8 * SLOT_BYTES).from_address(self.slots[-1])
                self._views.append(np.ctypeslib.as_array(buf))
        except BaseException:
            self.close()
            raise

    # ---- a store ----
    def load_store(
        self,
        store: WeightStore,
        dsts: dict[str, int],
        *,
        progress: LoadProgress | None = None,
    ) -> None:
        """Copies the store's tensors named in `dsts` (name -> device address) and checks every
        chunk of the store, those of tensors not copied (host-resident ones) included. Raises
        WeightStoreError naming the first bad chunk, or a file cut short while read; nothing is
        used before all are checked. A store opened from a file is read into the staging slots
        (pread: never mapped), a sealed copy is copied from its mapping. A vouched copy (checked
        in full by the gateway, and sealed) is not hashed again: only the copied tensors' bytes
        are staged. The work is one call into C (csrc/restore/chunk_loader.c) that does not hold
        the GIL, so a thread that runs it leaves the interpreter to the rest of the start-up.
        progress: made for this store, published to as chunks are done (and ended however this
        returns)."""
        h = store.header
        starts, pieces = _pieces(h, dsts)
        for s in range(SLOTS):
            self._wait(s)
        digests = None if store.vouched else np.frombuffer(h.chunk_digests, np.uint8)
        mapped = store.sealed and h.data_size
        args = _Load(
            data=store.data(0, h.data_size).ctypes.data if mapped else None,
            data_size=h.data_size,
            chunk_size=h.chunk_size,
            num_chunks=h.num_chunks,
            digests=digests.ctypes.data if digests is not None else None,
            piece_start=starts.ctypes.data,
            pieces=pieces.ctypes.data,
            slots=(c_void_p * SLOTS)(*self.slots),
            events=(c_void_p * SLOTS)(*self.events),
            num_slots=SLOTS,
            slot_bytes=SLOT_BYTES,
            stream=self.stream,
            workers=self.workers,
            progress=progress.handle if progress is not None else None,
            fd=-1 if mapped else store.fd,
            file_offset=h.data_offset,
        )
        bad, err = ctypes.c_uint32(), ctypes.create_string_buffer(256)
        code = _chunk_loader()(byref(args), byref(bad), err, len(err))
        self._pending = [True] * SLOTS  # NOTE: the last copies may still be in flight
        self.synchronize()
        _check_load(store, code, bad.value, err.value.decode(errors="replace"))

    # ---- arrays (a model file) ----
    def upload(self, dst: int, arr: np.ndarray) -> None:
        """Copies one array to device address `dst` through the slots, in turn."""
        raw = np.ascontiguousarray(arr).reshape(-1).view(np.uint8)
        for off in range(0, len(raw), SLOT_BYTES):
            s, self._next = self._next, (self._next + 1) % SLOTS
            self._wait(s)
            part = raw[off : off + SLOT_BYTES]
            np.copyto(self._views[s][: len(part)], part)
            self._copy(s, Piece(dst + off, 0, len(part)))
            self._record(s)

    # ---- slots ----
    def _wait(self, s: int) -> None:
        if self._pending[s]:
            self.rt("cudaEventSynchronize", c_void_p(self.events[s]))
            self._pending[s] = False

    def _copy(self, s: int, p: Piece) -> None:
        self.rt("cudaMemcpyAsync", c_void_p(p.dst), c_void_p(self.slots[s] + p.src),
                p.nbytes, H2D, c_void_p(self.stream))  # fmt: skip

    def _record(self, s: int) -> None:
        self.rt("cudaEventRecord", c_void_p(self.events[s]), c_void_p(self.stream))
        self._pending[s] = True

    def synchronize(self) -> None:
        self.rt("cudaStreamSynchronize", c_void_p(self.stream))
        self._pending = [False] * SLOTS

    def close(self) -> None:
        """Waits for the copies in flight, then frees the slots (also when the wait fails)."""
        try:
            if self.events and any(self._pending):
                self.synchronize()
        finally:
            self._views = []
            events, slots, self.events, self.slots = self.events, self.slots, [], []
            for ev in events:
                self.rt("cudaEventDestroy", c_void_p(ev))
            for h in slots:
                self.rt("cudaFreeHost", c_void_p(h))

    def __enter__(self) -> StagingRing:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
