"""A weight store's device-resident weights, copied while the rest of start-up goes on.

The copy (csrc/restore/chunk_loader.c) runs in a thread without the GIL, on a stream of its own
that never waits for the legacy stream (cudaStreamNonBlocking: on a GPU a blocking stream would
hold up every synchronous copy the restore makes until the weights are in). The tokenizer, the
workspace and the graph restore need none of the weights' bytes, only their addresses, so they run
meanwhile; the engine waits for the load before anything reads a weight (profiling, validation,
the first request). A bad chunk is raised at the wait, and the engine falls back to the model file
then, into the same buffers. `progress` says how far the load has got, chunk by chunk, for an
engine that runs its first layers meanwhile (medusa.engine.layer_gate)."""

from __future__ import annotations

import ctypes
import os
import threading
import time
from ctypes import c_uint, c_void_p
from pathlib import Path

from medusa import env
from medusa.cuda.backend import Backend
from medusa.weights import WeightStore
from medusa.weights.hold import held_at, wait_to_go
from medusa.weights.loader import SLOTS, LoadProgress, StagingRing

STREAM_NON_BLOCKING = 1  # cudaStreamNonBlocking


class WeightLoad:
    # Tests only: chunks from this index on wait for progress.release() (a load held part way).
    hold: int | None = None

    def __init__(self, b: Backend, store: WeightStore, dsts: dict[str, int]) -> None:
        """Starts copying the store's tensors named in `dsts` (name -> device address)."""
        self.b = b
        s = c_void_p()
        b.call("cudaStreamCreateWithFlags", ctypes.byref(s), c_uint(STREAM_NON_BLOCKING))
        self.stream = int(s.value or 0)
        try:
            # NOTE: every core, even on 2: the start-up waits for the copy before its restore and
            # its first step (only the tokenizer runs beside it), so a core left idle for it is
            # the copy's time lost (on simcuda the copy is the CPU's: scripts/bench/coldstart.py
            # --variant MEDUSA_WEIGHT_COPY_THREADS=1 measures it side by side)
            workers = env.WEIGHT_COPY_THREADS.get() or min(SLOTS // 2, os.cpu_count() or 1)
            workers = max(1, min(workers, SLOTS // 2))
            self.ring = StagingRing(b, self.stream, workers=workers)
        except BaseException:
            b.call("cudaStreamDestroy", c_void_p(self.stream))
            raise
        held = held_at()
        self.progress = LoadProgress(store.header, self.hold if held is None else held[0])
        self.error: BaseException | None = None
        self.seconds = 0.0  # the copy's own time, from start to its last byte
        self._thread = threading.Thread(
            target=self._run, args=(store, dsts), name="medusa-weights", daemon=True
        )
        self._thread.start()
        self._releaser: threading.Thread | None = None
        if held is not None:  # MEDUSA_HOLD_WEIGHTS (tests): released once told to go on
            self._releaser = threading.Thread(target=self._release_when_told, args=held)
            self._releaser.start()

    def _release_when_told(self, chunk: int, where: Path) -> None:
        while self.progress.num_done < chunk and self._thread.is_alive():
            time.sleep(0.01)
        if self._thread.is_alive():
            wait_to_go(where)
        self.progress.release()

    def _run(self, store: WeightStore, dsts: dict[str, int]) -> None:
        t0 = time.perf_counter()
        try:
            self.ring.load_store(store, dsts, progress=self.progress)
        except BaseException as e:  # NOTE: raised in the engine's thread, by wait()
            self.error = e
        finally:
            self.progress.stop()  # NOTE: no effect on a load that ended; one that never ran
        self.seconds = time.perf_counter() - t0

    def wait(self) -> None:
        """Returns once every weight is on the device; raises what the load raised (a
        WeightStoreError names the bad chunk). Frees the staging slots and the stream."""
        if self._releaser is not None:
            self._releaser.join()
        self._thread.join()
        self.progress.close()
        if self.stream:
            try:
                self.ring.close()
            finally:
                self.b.call("cudaStreamDestroy", c_void_p(self.stream))
                self.stream = 0
        if self.error is not None:
            raise self.error

    def wait_quietly(self) -> None:
        """wait() for a start that failed anyway: its own error is the one to report."""
        try:
            self.wait()
        except Exception:  # noqa: BLE001 - the start's failure is what the caller raises
            pass
