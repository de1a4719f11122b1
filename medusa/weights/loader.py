"""Copying weights to the device through a ring of pinned staging slots, several chunks in flight.

A worker takes a free slot (waiting for the event of its last copy), copies a chunk of the store
into it, checks the chunk's checksum on the staged bytes (the bytes that are sent, still in the
CPU's cache), then queues a cudaMemcpyAsync per tensor piece and records the slot's event. Workers
run in threads: the copies, the hash and the CUDA calls release the GIL. Arrays from a model file
take the same slots, so a start-up allocates the same whatever its weights come from (a restored
graph's allocation check sees no difference)."""

from __future__ import annotations

import bisect
import ctypes
import os
import queue
import threading
from collections.abc import Iterator
from ctypes import byref, c_int, c_size_t, c_uint, c_void_p
from dataclasses import dataclass

import numpy as np

from medusa.cuda import CudaError
from medusa.cuda.backend import Backend
from medusa.weights.errors import WeightStoreError
from medusa.weights.format import MAX_CHUNK
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
        self, store: WeightStore, dsts: dict[str, int], *, checked: bool = False
    ) -> None:
        """Copies the store's tensors named in `dsts` (name -> device address) and checks every
        chunk of the store, those of tensors not copied (host-resident ones) included. Raises
        WeightStoreError naming the first bad chunk; nothing is used before all are checked.
        checked: the gateway read and checked this very file in full and holds it mapped, so
        nothing is hashed again and only the copied tensors' bytes are staged."""
        h = store.header
        tensors = [t for t in h.tensors if t.name in dsts]
        starts = [t.offset for t in tensors]
        chunks: Iterator[int] = iter(range(h.num_chunks))
        lock = threading.Lock()
        errors: list[BaseException] = []
        free: queue.SimpleQueue[int] = queue.SimpleQueue()
        for s in range(SLOTS):
            free.put(s)

        def pieces(i: int) -> list[Piece]:
            lo, hi = h.chunk_range(i)
            out = []
            for t in tensors[max(0, bisect.bisect_right(starts, lo) - 1) :]:
                if t.offset >= hi:
                    break
                a, b = max(t.offset, lo), min(t.end, hi)
                if a < b:
                    out.append(Piece(dsts[t.name] + a - t.offset, a - lo, b - a))
            return out

        def work() -> None:
            while not errors:
                with lock:
                    i = next(chunks, None)
                if i is None:
                    return
                try:
                    self._chunk(store, i, pieces(i), free, checked)
                except BaseException as e:  # NOTE: handed to the caller, who re-raises it
                    errors.append(e)

        threads = [threading.Thread(target=work, daemon=True) for _ in range(self.workers - 1)]
        for t in threads:
            t.start()
        work()
        for t in threads:
            t.join()
        self.synchronize()
        if errors:
            raise min(errors, key=lambda e: 0 if isinstance(e, WeightStoreError) else 1)

    def _chunk(
        self,
        store: WeightStore,
        i: int,
        pieces: list[Piece],
        free: queue.SimpleQueue[int],
        checked: bool,
    ) -> None:
        src = store.data(*store.header.chunk_range(i))
        if not pieces:  # host-resident: checked in place, nothing to copy
            if not checked:
                store.check_chunk(i, src)
            return
        s = free.get()
        try:
            self._wait(s)
            staged = self._views[s][: len(src)]
            if checked:
                for p in pieces:
                    np.copyto(staged[p.src : p.src + p.nbytes], src[p.src : p.src + p.nbytes])
            else:
                np.copyto(staged, src)
                store.check_chunk(i, staged)
            for p in pieces:
                self._copy(s, p)
            self._record(s)
        finally:
            free.put(s)

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
        """Waits for the copies in flight, then frees the slots."""
        if self.events and any(self._pending):
            self.synchronize()
        self._views = []
        for ev in self.events:
            self.rt("cudaEventDestroy", c_void_p(ev))
        for h in self.slots:
            self.rt("cudaFreeHost", c_void_p(h))
        self.events, self.slots = [], []

    def __enter__(self) -> StagingRing:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
