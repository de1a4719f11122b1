"""The simcuda twin of scripts/gpu/torch_restore/decoder.py: the same harness (record, or restore
through Medusa and compare) driving a library that owns device memory as PyTorch does
(caching_allocator_model.c and caching_allocator.c, built into LIB by the test):

  python caching_allocator.py LIB record --ref DIR
  python caching_allocator.py LIB restore --artifact ART --ref DIR
"""

from __future__ import annotations

import ctypes
import os
import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "scripts" / "gpu" / "torch_restore"))
import harness  # noqa: E402  (scripts/gpu/torch_restore/harness.py: the GPU check's own)

from medusa.cuda import load_backend  # noqa: E402
from medusa.cuda.backend import Backend  # noqa: E402

V = 128  # vocabulary: the logits per sequence (caching_allocator_model.c)


class Twin:
    label = "caching-allocator restore"
    batch_sizes: tuple[int, ...] = (4, 2, 1)

    def __init__(self, path: str) -> None:
        self.path = path
        self.b: Backend | None = None
        self.lib: ctypes.CDLL | None = None

    def _call(self, name: str, *args: object) -> None:
        assert self.lib is not None and self.b is not None
        code = getattr(self.lib, name)(*args)
        if code:
            raise RuntimeError(f"{name} failed with {self.b.error_name(code)}")

    def setup(self) -> None:
        self.b = load_backend("sim")
        self.lib = ctypes.CDLL(self.path, mode=os.RTLD_NOW | os.RTLD_GLOBAL)
        self.lib.ca_stream.restype = ctypes.c_uint64
        self._call("ca_setup", ctypes.c_uint32(2026))
        for batch in self.batch_sizes:
            self._call("ca_warmup", batch)
        self._call("ca_empty_cache")

    def capture(self, batch: int) -> int:
        exec_ = ctypes.c_void_p()
        self._call("ca_capture", batch, ctypes.byref(exec_))
        return int(exec_.value or 0)

    def replay(self, graph: int) -> None:
        self.backend().graph_launch(graph, self.stream())

    def backend(self) -> Backend:
        assert self.b is not None
        return self.b

    def stream(self) -> int:
        assert self.lib is not None
        return int(self.lib.ca_stream())

    def step(self, batch: int, step: int, run: Callable[[], None]) -> bytes:
        self._call("ca_inputs", batch, step)
        run()
        self.synchronize()
        out = (ctypes.c_float * (batch * V))()
        self._call("ca_output", batch, out)
        return bytes(out)

    def synchronize(self) -> None:
        self.backend().stream_synchronize(self.stream())


if __name__ == "__main__":
    if len(sys.argv) < 2 or not Path(sys.argv[1]).is_file():
        sys.exit(f"usage: {sys.argv[0]} LIB record|restore ... (LIB: caching_allocator_model.c)")
    sys.exit(harness.main(lambda: Twin(sys.argv[1]), sys.argv[2:]))
