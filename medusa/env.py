"""Every MEDUSA_* environment variable, declared once and typed.

The MEDUSA_SIM_* variables are read by libsimcuda itself (C); they are declared here so that there
is one place that lists them, and so that tools can pass them to child processes by name.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class EnvVar(Generic[T]):
    name: str
    default: T
    help: str

    def get(self) -> T:
        raw = os.environ.get(self.name)
        if raw is None or raw == "":
            return self.default
        if isinstance(self.default, bool):
            return raw.lower() not in ("0", "false", "no", "off")  # type: ignore[return-value]
        if isinstance(self.default, int):
            try:
                return int(raw, 0)  # type: ignore[return-value]
            except ValueError:
                raise ValueError(f"{self.name}={raw!r} is not an integer") from None
        return raw  # type: ignore[return-value]


DEVICE = EnvVar(
    "MEDUSA_DEVICE", "auto", "back-end: auto (a real GPU if present, else sim), cuda, sim"
)
LIB_DIR = EnvVar("MEDUSA_LIB_DIR", "", "directory holding libsimcuda.so (default: the package's)")
SIM_SEED = EnvVar("MEDUSA_SIM_SEED", "", "simcuda: seed for the arena's random base address")
SIM_MEMORY = EnvVar("MEDUSA_SIM_MEMORY", "8G", "simcuda: device memory size (e.g. 8G, 12G)")
SIM_SMS = EnvVar("MEDUSA_SIM_SMS", 132, "simcuda: number of SMs the device reports")
SIM_CC = EnvVar("MEDUSA_SIM_CC", "9.0", "simcuda: compute capability the device reports")
SIM_DEVICE_NAME = EnvVar("MEDUSA_SIM_DEVICE_NAME", "", "simcuda: device name it reports")
SIM_DEVICE_INDEX = EnvVar(
    "MEDUSA_SIM_DEVICE_INDEX", 0, "simcuda: which board of a multi-GPU machine (UUID, PCI bus)"
)
NCCL_TIMEOUT = EnvVar(
    "MEDUSA_NCCL_TIMEOUT", 30.0, "libmedusa_nccl: seconds a collective waits for the other ranks"
)
NCCL_SLOT_BYTES = EnvVar(
    "MEDUSA_NCCL_SLOT_BYTES", 4 << 20, "libmedusa_nccl: bytes per rank exchanged per step"
)
BLAS_THREADS = EnvVar(
    "MEDUSA_BLAS_THREADS",
    0,
    "simcuda: threads of the CPU BLAS behind mblas (0: its own default; a tensor-parallel rank "
    "sets its share of the cores)",
)
SIM_THREADS = EnvVar(
    "MEDUSA_SIM_THREADS",
    0,
    "simcuda: host threads a kernel's parts run on (simcudaParallel: HybridGEMM's tiles), the "
    "kernel's own among them (0: one per CPU this process may use, at most 16; a "
    "tensor-parallel rank sets its share of the cores)",
)
WEIGHT_COPY_THREADS = EnvVar(
    "MEDUSA_WEIGHT_COPY_THREADS",
    0,
    "threads copying a weight store to the device at start-up (0: one per CPU core, at most 2)",
)
SIM_MEMCHECK = EnvVar("MEDUSA_SIM_MEMCHECK", False, "simcuda: check kernel pointer arguments")
SIM_VERBOSE = EnvVar("MEDUSA_SIM_VERBOSE", False, "simcuda: print failure messages to stderr")
SIM_POISON = EnvVar(
    "MEDUSA_SIM_POISON",
    True,
    "simcuda: fresh device memory holds per-process stale bytes; 0: zeroes",
)
SIM_DRIVER_VERSION = EnvVar(
    "MEDUSA_SIM_DRIVER_VERSION",
    "",
    "simcuda: CUDA version the driver claims (e.g. 12030); newer entry points are hidden",
)
SIM_ACCESSES = EnvVar(
    "MEDUSA_SIM_ACCESSES",
    "",
    "simcuda: record the pages each kernel reads and writes (1: every kernel, graphs: graph "
    "launches only); for Tessera's access analysis",
)
SIM_RACECHECK = EnvVar(
    "MEDUSA_SIM_RACECHECK",
    False,
    "simcuda: fail an access that races with another stream's (or graph node's) unordered one, "
    "naming both; on in the test suite",
)
SIM_SCHEDULE_SEED = EnvVar(
    "MEDUSA_SIM_SCHEDULE_SEED",
    1,
    "simcuda: seed of the order in which queued work of different streams (and graph nodes with "
    "no path between them) runs; a race report names it",
)
SIM_SLOWDOWN = EnvVar(
    "MEDUSA_SIM_SLOWDOWN",
    "",
    "simcuda: a device this many times slower than the CPU (1 to 1000): each kernel's thread "
    "waits the rest of the time; for benchmarks of overlap",
)
BLAS_LIB = EnvVar(
    "MEDUSA_BLAS_LIB",
    "",
    "simcuda's CPU kernels: the BLAS library to dlopen for matrix products (default: one already "
    "loaded, else the system's libopenblas/libcblas/libblas, else a plain loop)",
)
TRACE = EnvVar(
    "MEDUSA_TRACE", "", "recorder: trace file to create (%p: the pid); unset: no recording"
)
TRACE_SHIFT = EnvVar(
    "MEDUSA_TRACE_SHIFT",
    0,
    "recorder: bytes of device memory to allocate before the program's first allocation, so "
    "that a second recording sees every address shifted (materialize sets it)",
)
KV_LEDGER = EnvVar(
    "MEDUSA_KV_LEDGER",
    "",
    "elastic KV: the device's page ledger file, shared by the workers on one device or slice "
    "(whoever starts them makes it); unset: a private budget of the worker's KV size",
)
ARTIFACT = EnvVar("MEDUSA_ARTIFACT", "", "vLLM plugin: restore from this artifact directory")
REQUIRE_ARTIFACT = EnvVar(
    "MEDUSA_REQUIRE_ARTIFACT",
    False,
    "vLLM plugin: an unusable artifact is an error, not a fallback",
)
TRUST = EnvVar(
    "MEDUSA_TRUST", "", "vLLM plugin: the public key an artifact must be signed with (--trust)"
)
VLLM_SIDECAR = EnvVar(
    "MEDUSA_VLLM_SIDECAR", "", "vLLM plugin: record; the sidecar file to write (%p: the pid)"
)
PARENT_PID = EnvVar("MEDUSA_PARENT_PID", 0, "medusa run: exit when this process (the gateway) dies")
LOG_LEVEL = EnvVar(
    "MEDUSA_LOG_LEVEL",
    "",
    "log level of medusa commands (DEBUG, INFO, WARNING...); default: INFO, WARNING with --demo",
)
MODE = EnvVar("MEDUSA_MODE", "record", "recorder: record (everything) or restore (allocations)")
WORKER_TOKEN = EnvVar(
    "MEDUSA_WORKER_TOKEN",
    "",
    "medusa run: answer only requests that send it (the gateway sets one per worker)",
)
WEAVING_DIR = EnvVar(
    "MEDUSA_WEAVING_DIR",
    "",
    "medusa run: the private directory (this user's, mode 0700) where the gateway's workers make "
    "and open Weaver exchange regions, by name; the weaving routes are off without it and "
    "MEDUSA_WORKER_TOKEN (the gateway sets both)",
)
ARTIFACT_CACHE = EnvVar(
    "MEDUSA_ARTIFACT_CACHE",
    "",
    "gateway --cluster ray: where each node keeps the artifacts shipped to it, by digest "
    "(default ~/.cache/medusa/artifacts)",
)
GATEWAY_SIM_SLICES = EnvVar(
    "MEDUSA_GATEWAY_SIM_SLICES",
    2,
    "gateway: simcuda slices (8 GiB, 132 SMs each) on a machine with no GPU and no slices file",
)

STORE_CHECKED = EnvVar(
    "MEDUSA_STORE_CHECKED",
    "",
    "medusa run: the descriptor number, in the gateway that started this worker, of a sealed "
    "in-memory copy of the weight store that it checked in full: the worker maps that copy "
    "(/proc/<parent>/fd/N) and does not hash it again (the gateway sets it)",
)
POOL_STORES_CHECKED = EnvVar(
    "MEDUSA_POOL_STORES_CHECKED",
    "",
    "medusa run --pool: the gateway's checked copies of its resident models' weight stores, as "
    'JSON {"artifact directory": descriptor number}: the pooled worker maps the copy of each '
    "--prepare-artifact it names at warm-up, its pages read in (the gateway sets it)",
)
HOLD_WEIGHTS = EnvVar(
    "MEDUSA_HOLD_WEIGHTS",
    "",
    "tests only: N:DIR: a weight store's reader (a worker's load, the gateway's copy) stops "
    "before chunk N of its data, creates DIR/held-<pid>, and goes on once DIR/go-<pid> exists "
    "(a store changed part way through a read, deterministically)",
)

ALL: tuple[EnvVar, ...] = (
    DEVICE,
    LIB_DIR,
    SIM_SEED,
    SIM_MEMORY,
    SIM_SMS,
    SIM_CC,
    SIM_DEVICE_NAME,
    SIM_DEVICE_INDEX,
    NCCL_TIMEOUT,
    NCCL_SLOT_BYTES,
    BLAS_THREADS,
    SIM_THREADS,
    WEIGHT_COPY_THREADS,
    SIM_MEMCHECK,
    SIM_VERBOSE,
    SIM_POISON,
    SIM_DRIVER_VERSION,
    SIM_ACCESSES,
    SIM_RACECHECK,
    SIM_SCHEDULE_SEED,
    SIM_SLOWDOWN,
    BLAS_LIB,
    TRACE,
    TRACE_SHIFT,
    KV_LEDGER,
    MODE,
    LOG_LEVEL,
    WORKER_TOKEN,
    WEAVING_DIR,
    STORE_CHECKED,
    POOL_STORES_CHECKED,
    HOLD_WEIGHTS,
    PARENT_PID,
    ARTIFACT,
    REQUIRE_ARTIFACT,
    VLLM_SIDECAR,
    TRUST,
    ARTIFACT_CACHE,
    GATEWAY_SIM_SLICES,
)
