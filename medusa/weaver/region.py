"""The exchange region between a hot worker (sender) and the worker that runs part of its
attention (receiver): one file under /dev/shm that both map, host-mapped memory for the receiver's
kernels (Device.host_register). On a GPU the same layout would sit in NVLink peer memory or in C2C
host memory; MIG slices have no peer access, so between slices it must be host memory.

Layout: a 4 KiB header (geometry, counters each on its own cache line, the receiver's heartbeat
and pid, an error line), then one task: its kind, layer and sequences, then q, k, v and out rows
(float32; q and out [max_tokens, num_heads * head_dim], k and v [max_tokens, num_kv_heads *
head_dim]). One task is in flight at a time: a layer's next step needs this layer's output.

Protocol: the sender writes the task, then bumps `task`; the receiver, polling at its kernel
boundaries, sees task > done, runs it, writes the output, then sets done = task. The receiver
stamps `heartbeat` (CLOCK_MONOTONIC ns) at every poll, so a sender can tell a receiver that died or
hangs from one that is busy.

The file is a private one of this user (0600), made with O_EXCL|O_NOFOLLOW and opened with
O_NOFOLLOW; between workers of a gateway it lives in the directory the gateway gave them
(medusa.weaver.region_dir), named, never given as a path. Everything the receiver reads from it
is checked before it touches device memory (medusa.weaver.receiver)."""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import os
import stat
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from medusa.errors import RefusedError

MAGIC = b"MDSWEAV1"
HEADER_BYTES = 4096
GEOMETRY = struct.Struct("<8s8i")  # magic, layers, heads, kv heads, head dim, seqs, tokens, 2 spare
# int64 counters at these offsets, a cache line apart (the GPU polling kernel reads `task`).
TASK, DONE, HEARTBEAT, RECEIVER_PID, SENDER_PID, STATUS = (64 * (i + 1) for i in range(6))
ERROR, ERROR_BYTES = 512, 512
TASK_HEAD = struct.Struct("<4i")  # kind, layer, num_seqs, num_tokens

ATTEND, RELEASE, FETCH, STOP, APPEND = 1, 2, 3, 4, 5  # task kinds (APPEND: k/v, no attention)
OK, FAILED = 0, 1  # STATUS values
MAX_LAYERS, MAX_WIDTH = 1024, 1 << 16  # bounds of a geometry (Llama 405B: 126 layers, 16384)


def process_alive(pid: int) -> bool:
    """False for a pid that is gone or a zombie (a dead child not yet reaped); the peer's pid in
    the region is one of this user's processes on this machine."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError, ProcessLookupError):
        return False
    return state not in (b"Z", b"X")


class RegionError(RefusedError, RuntimeError):
    """The region file is missing, not an exchange region, or of another geometry."""


@dataclass(frozen=True)
class Geometry:
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    max_seqs: int  # offloaded sequences per task
    max_tokens: int  # rows per task (a prefill chunk or one token per sequence)

    def __post_init__(self) -> None:
        if min(self.num_layers, self.num_heads, self.num_kv_heads, self.head_dim) < 1:
            raise ValueError(f"{self}: layers, heads, kv heads and head_dim must be >= 1")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"{self}: num_heads must be a multiple of num_kv_heads")
        if not 1 <= self.max_seqs <= self.max_tokens:
            raise ValueError(f"{self}: need 1 <= max_seqs <= max_tokens")
        # NOTE: kernels take these and their products (a block's floats) as 32-bit ints.
        if self.num_layers > MAX_LAYERS or self.q_size > MAX_WIDTH or self.kv_size > MAX_WIDTH:
            raise ValueError(
                f"{self}: at most {MAX_LAYERS} layers and {MAX_WIDTH} floats of q or k per token"
            )

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    def offsets(self) -> dict[str, int]:
        """Byte offset of each array of the task, 256-byte aligned like a device allocation."""
        s, t = self.max_seqs, self.max_tokens
        sizes = {"head": TASK_HEAD.size, "seq_ids": 4 * s, "seq_lens": 4 * s,
                 "query_start": 4 * (s + 1), "q": 4 * t * self.q_size, "k": 4 * t * self.kv_size,
                 "v": 4 * t * self.kv_size, "out": 4 * t * self.q_size}  # fmt: skip
        out, at = {}, HEADER_BYTES
        for name, size in sizes.items():
            out[name] = at
            at += -(-size // 256) * 256
        out["end"] = at
        return out


def _check_file(path: Path, fd: int) -> int:
    """The size of the region file open at fd, if it is a private file of this user's."""
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        raise RegionError(f"{path}: not a regular file, so not an exchange region")
    if st.st_uid != os.geteuid() or st.st_mode & 0o077:
        raise RegionError(
            f"{path}: not a private file of this user (owner uid {st.st_uid}, mode "
            f"{stat.S_IMODE(st.st_mode):o}); a sender of this user makes its region (mode 600)"
        )
    if st.st_size < HEADER_BYTES:
        raise RegionError(f"{path}: {st.st_size} bytes is not an exchange region")
    return st.st_size


def _geometry(path: Path, view: mmap.mmap, size: int) -> tuple[Geometry, dict[str, int]]:
    magic, *dims = GEOMETRY.unpack_from(view, 0)
    if magic != MAGIC:
        raise RegionError(f"{path}: not an exchange region (magic {magic!r})")
    try:
        geometry = Geometry(*dims[:6])
    except ValueError as e:
        raise RegionError(f"{path}: not a usable exchange region: {e}") from None
    layout = geometry.offsets()
    if size != layout["end"]:
        raise RegionError(f"{path}: {size} bytes, its geometry needs {layout['end']}")
    return geometry, layout


class ExchangeRegion:
    """One process's mapping of the region; `create` makes the file, the constructor opens it."""

    def __init__(self, path: str | Path, *, dir_fd: int | None = None) -> None:
        """dir_fd: `path`'s directory, opened (RegionDir): the file is its name there."""
        self.path, self._dir_fd = Path(path), dir_fd
        try:
            fd = os.open(self._name, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
        except FileNotFoundError:
            raise RegionError(
                f"{self.path}: no exchange region here; the sender creates it"
            ) from None
        except OSError as e:
            raise RegionError(
                f"{self.path}: cannot open it as an exchange region: {e.strerror}"
            ) from None
        try:
            size = _check_file(self.path, fd)
            self._map = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        try:
            self.geometry, self.layout = _geometry(self.path, self._map, size)
        except BaseException:
            self._map.close()
            raise
        self._anchor = ctypes.c_char.from_buffer(self._map)
        self.address = ctypes.addressof(self._anchor)  # host address, page aligned

    @property
    def _name(self) -> str | Path:
        return self.path.name if self._dir_fd is not None else self.path

    @classmethod
    def create(
        cls, path: str | Path, geometry: Geometry, *, dir_fd: int | None = None
    ) -> ExchangeRegion:
        """A new region file (O_CREAT|O_EXCL|O_NOFOLLOW, mode 0600: never an existing file or
        a link planted there); dir_fd as for the constructor."""
        path = Path(path)
        size = geometry.offsets()["end"]
        name = path.name if dir_fd is not None else path
        flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(name, flags, 0o600, dir_fd=dir_fd)
        try:
            os.ftruncate(fd, size)
            g = geometry
            header = GEOMETRY.pack(MAGIC, g.num_layers, g.num_heads, g.num_kv_heads, g.head_dim,
                                   g.max_seqs, g.max_tokens, 0, 0)  # fmt: skip
            os.pwrite(fd, header, 0)
        finally:
            os.close(fd)
        return cls(path, dir_fd=dir_fd)

    def unlink(self) -> None:
        """Removes the region's file (the sender's, when the pairing ends)."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._name, dir_fd=self._dir_fd)

    # ---- counters ----
    def counter(self, offset: int) -> int:
        return int(np.frombuffer(self._map, np.int64, 1, offset)[0])

    def set_counter(self, offset: int, value: int) -> None:
        # NOTE: one aligned 8-byte store; x86 keeps stores in order, so the payload written
        # before it is visible first (a GPU writer needs __threadfence_system() in between).
        np.frombuffer(self._map, np.int64, 1, offset)[0] = value

    def error(self) -> str:
        raw = bytes(self._map[ERROR : ERROR + ERROR_BYTES])
        return raw.split(b"\0", 1)[0].decode("utf-8", "replace")

    def fail(self, message: str) -> None:
        data = message.encode()[: ERROR_BYTES - 1]
        self._map[ERROR : ERROR + ERROR_BYTES] = data.ljust(ERROR_BYTES, b"\0")
        self.set_counter(STATUS, FAILED)

    # ---- the task ----
    def task_head(self) -> tuple[int, int, int, int]:
        return TASK_HEAD.unpack_from(self._map, self.layout["head"])  # type: ignore[return-value]

    def set_task_head(self, kind: int, layer: int, num_seqs: int, num_tokens: int) -> None:
        TASK_HEAD.pack_into(self._map, self.layout["head"], kind, layer, num_seqs, num_tokens)

    def array(self, name: str) -> np.ndarray:
        """A numpy view of one task array (int32 for the sequence arrays, float32 rows else)."""
        g = self.geometry
        shape = {"seq_ids": (g.max_seqs,), "seq_lens": (g.max_seqs,),
                 "query_start": (g.max_seqs + 1,), "q": (g.max_tokens, g.q_size),
                 "k": (g.max_tokens, g.kv_size), "v": (g.max_tokens, g.kv_size),
                 "out": (g.max_tokens, g.q_size)}[name]  # fmt: skip
        dtype = np.float32 if len(shape) == 2 else np.int32
        count = int(np.prod(shape))
        return np.frombuffer(self._map, dtype, count, self.layout[name]).reshape(shape)

    def close(self) -> None:
        del self._anchor
        self._map.close()
