"""A real device (a GPU or a MIG instance) serves one gateway of this user at a time: the gateway
(or the Ray slice actor that takes it) holds an flock on a file named after the device's UUID in
this user's claims directory (~/.cache/medusa/claims, mode 0700) for as long as it may place
workers there; the kernel releases it when that process ends. Two gateways on one device would
each count the whole device in a page ledger of their own and overcommit it.

Simulated slices are not claimed: each worker's simcuda device is its own process's memory, so
two gateways on one topology file share nothing. Another user's gateway cannot be seen from here
(its claims are in its own home): a device shared between users is theirs to split (give each
its own devices with CUDA_VISIBLE_DEVICES or device permissions)."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import stat
from collections.abc import Iterable
from pathlib import Path

from medusa.serve.gateway.slices import Slice

log = logging.getLogger("medusa.gateway")


def claims_dir() -> Path:
    path = Path.home() / ".cache" / "medusa" / "claims"
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    st = path.lstat()
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
        raise OSError(f"{path} is not a directory of this user's only (mode 700)")
    return path


def device_of(s: Slice) -> str | None:
    """The device a slice's workers use, if it is a real one."""
    return s.env.get("CUDA_VISIBLE_DEVICES") or None


def claim(device: str, where: Path | None = None) -> int | None:
    """An open descriptor holding the claim on `device`, or None if another process holds it."""
    where = where or claims_dir()
    name = hashlib.sha256(device.encode()).hexdigest()[:32]
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(where / f"{name}.lock", flags, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()} {device}\n".encode(), 0)
    return fd


def holder(device: str, where: Path) -> str:
    name = hashlib.sha256(device.encode()).hexdigest()[:32]
    with contextlib.suppress(OSError, ValueError):
        return (where / f"{name}.lock").read_text().split()[0]
    return "?"


def claim_devices(slices: Iterable[Slice], where: Path | None = None) -> list[int]:
    """Claims every real device of `slices`; ValueError naming those another gateway of this
    user holds (nothing is claimed then)."""
    real = [(s, d) for s in slices if (d := device_of(s)) is not None]
    if not real:
        return []
    try:
        where = where or claims_dir()
    except OSError as e:
        log.warning("cannot claim this gateway's devices (%s): another gateway of this user on "
                    "them would not be noticed", e)  # fmt: skip
        return []
    held, taken = [], []
    for s, d in real:
        fd = claim(d, where)
        if fd is None:
            taken.append(f"{s.id} (pid {holder(d, where)})")
        else:
            held.append(fd)
    if taken:
        release(held)
        raise ValueError(
            f"slices {', '.join(taken)} are in use by another medusa gateway of this user "
            f"(claims in {where}): stop it, or give this gateway other devices "
            "(CUDA_VISIBLE_DEVICES, or a slices file)"
        )
    return held


def release(fds: list[int]) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)
    fds.clear()
