"""Sealed copies of a weight store: the store's file read into a memfd that is then sealed
(F_SEAL_WRITE, F_SEAL_SHRINK, F_SEAL_GROW), so its bytes can no longer change or go, whoever holds
the file or the descriptor; mapped read-only, it is what weights="host" registers for the device.

The gateway makes one per host-weight model, checks every chunk on the sealed bytes, and only then
adds F_SEAL_SEAL: a copy sealed with all four is one checked in full. A worker it starts is told
the copy's descriptor number (MEDUSA_STORE_CHECKED) and opens it through /proc/<its parent>/fd/N
(only its parent, the gateway, holds it; the kernel lets only the same user open it there), maps
it and loads without hashing. A worker without one makes a copy of its own (sealed at once, its
chunks checked as it loads). File times vouch for nothing here: a write through a shared mapping
of a file changes neither time."""

from __future__ import annotations

import errno
import fcntl
import mmap
import os
import stat
from pathlib import Path

from medusa.weights.errors import WeightStoreError
from medusa.weights.format import Header
from medusa.weights.hold import held_at, wait_to_go
from medusa.weights.store import WeightStore, check_digest, read_header

CONTENT_SEALS = fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW
CHECKED_SEALS = CONTENT_SEALS | fcntl.F_SEAL_SEAL  # the last one added once every chunk passed
_SENDFILE_MAX = 1 << 30
_MEMFD = os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING


def seal_store(store: WeightStore, *, check: bool) -> WeightStore:
    """A sealed copy of file-backed `store` (closed, whatever happens: the copy replaces it).
    check: every chunk checked on the sealed bytes, then F_SEAL_SEAL (vouched); else the loader
    checks them.
    WeightStoreError if the file changed size or header while copied, or a chunk is bad; OSError
    (ENOMEM, ENOSPC) if memory is short."""
    where = str(store.path)
    try:
        fd = os.memfd_create(f"medusa-store:{store.path.name}", _MEMFD)
    except BaseException:
        store.close()
        raise
    copy: WeightStore | None = None
    try:
        _copy_file(store.fd, fd, store.header, store.nbytes, where)
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, CONTENT_SEALS)
        header = read_header(fd, store.nbytes, where)  # NOTE: the copy's own, not the file's
        if header.digest != store.header.digest:
            raise WeightStoreError(f"{where}: its header changed while it was read; try again")
        mm = mmap.mmap(fd, store.nbytes, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
        copy = WeightStore(store.path, header, fd, store.nbytes, mapping=mm)
        if check:
            copy.verify()
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SEAL)
            copy.vouched = True
    except BaseException:
        if copy is not None:
            copy.close()
        else:
            os.close(fd)
        raise
    finally:
        store.close()
    return copy


def _copy_file(src: int, dst: int, header: Header, size: int, where: str) -> None:
    """`size` bytes of file src into dst, in the kernel (sendfile: no mapping of the file, so one
    cut short ends the copy instead of raising SIGBUS)."""
    held = held_at()
    stop = header.data_offset + held[0] * header.chunk_size if held else size
    done = 0
    while done < size:
        if held is not None and done == stop:
            wait_to_go(held[1])  # MEDUSA_HOLD_WEIGHTS (tests)
        end = min(stop, size) if done < stop else size
        n = os.sendfile(dst, src, done, min(_SENDFILE_MAX, end - done))
        if n == 0:
            raise WeightStoreError(
                f"{where}: ends at byte {done} of {size} (cut short while read); materialize again"
            )
        done += n


def open_vouched(number: int, path: Path, digest: str) -> WeightStore:
    """The sealed, checked copy of the store `path` (header `digest`) that this process's parent
    holds as descriptor `number`: WeightStoreError unless it is a sealed copy checked in full
    (all four seals) of that very header."""
    where = f"{path} (the gateway's checked copy, descriptor {number})"
    try:
        fd = os.open(f"/proc/{os.getppid()}/fd/{number}", os.O_RDONLY | os.O_CLOEXEC)
    except OSError as e:
        raise WeightStoreError(f"{where}: cannot be opened ({e.strerror})") from None
    try:
        try:
            seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
        except OSError as e:
            if e.errno != errno.EINVAL:
                raise
            seals = 0  # not a memfd
        st = os.fstat(fd)
        if seals & CHECKED_SEALS != CHECKED_SEALS or not stat.S_ISREG(st.st_mode):
            raise WeightStoreError(f"{where}: not a sealed copy checked in full")
        header = read_header(fd, st.st_size, where)
        check_digest(header, digest, where)
        mm = mmap.mmap(fd, st.st_size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
    except OSError as e:
        os.close(fd)
        raise WeightStoreError(f"{where}: cannot be read ({e.strerror})") from None
    except BaseException:
        os.close(fd)
        raise
    return WeightStore(path, header, fd, st.st_size, mapping=mm, vouched=True)
