"""Online restore: map the plan's allocations onto this process's, replay what skipped phases
allocated, resolve kernels, write permanent buffers, and build every graph in C."""

from __future__ import annotations

import ctypes
import logging
import time
from collections import Counter
from collections.abc import Mapping
from ctypes import c_int, c_size_t, c_uint, c_void_p
from dataclasses import dataclass, field

import numpy as np

from medusa.artifact import Artifact, ArtifactError
from medusa.artifact.layout import RELOC, pack_funcs
from medusa.cuda.backend import Backend
from medusa.restore.builder import KINDS, GraphBuilder, graph_arrays, name_kernel
from medusa.restore.errors import RestoreError
from medusa.restore.kernels import KernelFinder, find_kernels, global_addresses
from medusa.restore.own_run import OwnRun, map_allocations, read_own
from medusa.restore.scaled import scaled_allocs, scaled_plan
from medusa.restore.validate import validate_plan
from medusa.trace.run_view import DEVICE, GLOBAL, HOST, VMM

log = logging.getLogger("medusa.restore")


@dataclass
class RestoreResult:
    execs: list[int]
    methods: Counter[str] = field(default_factory=Counter)
    timings: dict[str, float] = field(default_factory=dict)


class Restorer:
    def __init__(
        self,
        artifact: Artifact,
        backend: Backend,
        *,
        since: int = 0,
        sizes: Mapping[tuple[str, int], int] | None = None,
        count: int | None = None,
    ) -> None:
        """since: the trace sequence number this start-up began after. A process that starts a
        second engine while the first lives (tessera's pipelined executor: one per request group
        in flight) matches the second's allocations against only what it made since; kernels are
        still found through every image the process loaded. sizes: allocations of phases this
        start-up runs that it makes at another size than recorded, (phase, ordinal) -> bytes (the
        engine's KV cache, sized for this device); pointers into them relocate by their base,
        and the plan is checked again against a smaller size. Every other allocation must match
        its recorded size. count: this start-up's KV blocks, for a plan recorded at two counts
        (plan["scale"]): its scaled allocations may have any size, pointers that follow the
        count move with it (scaled.py), and the plan is checked again at this start-up's
        sizes."""
        # NOTE: the plan is checked whole before any C call reads it (validate.py); a pooled
        # worker checked it at warm-up (Artifact.plan_checked).
        if not artifact.plan_checked:
            validate_plan(artifact.plan, str(artifact.path))
        self.art, self.b = artifact, backend
        self.plan = artifact.plan if count is None else scaled_plan(artifact.plan, count)
        self.any_size = scaled_allocs(self.plan) if count is not None else set()
        self.since = since
        self.sizes = dict(sizes or {})
        self.bases: list[np.ndarray] = [np.zeros(0, np.uint64) for _ in range(KINDS)]
        self.builder = GraphBuilder(self.bases)
        self._execs: list[int] = []
        self.last_timings: dict[str, float] = {}
        self._own: OwnRun | None = None
        self._index: dict[tuple[str, int], int] | None = None
        self.funcs: np.ndarray = np.zeros(0)
        self._finder: KernelFinder | None = None

    # ---- allocations ----
    def _own_run(self) -> OwnRun:
        if self._own is None:
            self._own = read_own(self.since)
        return self._own

    def map_allocations(self) -> None:
        """Checks this start-up allocated what the recorded one did in the phases it ran, then
        replays the skipped phases' allocations (and frees) in recorded order."""
        own = self._own_run()
        plan_allocs = self.plan["allocs"]
        phases = own.entered - set(self.plan["skipped_phases"])
        base = map_allocations(plan_allocs, own, phases, self.sizes, self.any_size)
        self.bases[DEVICE] = self.bases[HOST] = base
        self._check_resized()
        for op, i in self.plan["replay"]:
            kind, size = plan_allocs[i][2], plan_allocs[i][3]
            if op == "a":
                base[i] = self._alloc(kind, size)
            else:
                self._free(kind, int(base[i]))
                base[i] = 0

    def _check_resized(self) -> None:
        """The plan checked again with the sizes this start-up chose, where one is smaller than
        recorded: no relocation, copy or fill of a graph may reach past the end."""
        sizes = self.sizes
        smaller = {
            i: sizes[(p, o)]
            for i, (p, o, _k, size, _f) in enumerate(self.plan["allocs"])
            if (p, o) in sizes and (sizes[(p, o)] < size or i in self.any_size)
        }
        if not smaller and self.plan is self.art.plan:
            return
        try:
            validate_plan(self.plan, str(self.art.path), sizes=smaller)
        except ArtifactError as e:
            raise RestoreError(
                f"an allocation sized for this device ({', '.join(map(str, smaller.values()))} "
                f"bytes) is smaller than the restored graphs use: {e}; give the KV cache more "
                "(--gpu-memory-utilization, --kv-cache-memory) or materialize on this device"
            ) from None

    def address(self, phase: str, ordinal: int) -> int:
        """Where the recorded allocation (phase, ordinal) lives in this process."""
        if self._index is None:  # NOTE: the first of a (phase, ordinal) listed twice
            self._index = {}
            for i, (p, o, *_rest) in enumerate(self.plan["allocs"]):
                self._index.setdefault((p, o), i)
        i = self._index.get((phase, ordinal))
        if i is not None:
            return int(self.bases[DEVICE][i])
        raise RestoreError(f"the artifact has no allocation #{ordinal} in phase {phase!r}")

    def release(self, *, graphs: bool = True) -> None:
        """Frees what was replayed and (unless their owner destroys them) the graphs built: undoes
        a restore that failed half-way, or cleans up at shutdown."""
        for exec_ in self._execs if graphs else ():
            self.b.call("cudaGraphExecDestroy", c_void_p(exec_))
        self._execs = []
        skipped = set(self.plan["skipped_phases"])
        base = self.bases[DEVICE]
        # NOTE: what replay left live, by address (its frees zero the address), not by the plan's
        # `freed` flags: a plan whose flags disagree with its replay must not leak device memory.
        for i, (phase, _o, kind, _size, _freed) in enumerate(self.plan["allocs"]):
            if phase in skipped and i < base.size and base[i]:
                self._free(kind, int(base[i]))
                base[i] = 0

    def _alloc(self, kind: int, size: int) -> int:
        if kind == DEVICE:
            return self.b.malloc(size)
        p, d = c_void_p(), c_void_p()
        self.b.call("cudaHostAlloc", ctypes.byref(p), c_size_t(size), c_uint(2))  # mapped
        self.b.call("cudaHostGetDevicePointer", ctypes.byref(d), p, c_uint(0))
        return int(d.value or 0)

    def _free(self, kind: int, addr: int) -> None:
        if kind == DEVICE:
            self.b.free(addr)
        else:
            self.b.call("cudaFreeHost", c_void_p(addr))

    # ---- kernels and globals (kernels.py) ----
    def resolve_kernels(self) -> tuple[np.ndarray, Counter[str]]:
        self._finder = KernelFinder(self.b, self.art, self._own_run().trace, self.builder.lib)
        return find_kernels(self._finder, self.plan["funcs"])

    def map_globals(self) -> None:
        globals_ = self.plan["globals"]
        libs = self._finder.libs if globals_ and self._finder else {}
        self.bases[GLOBAL] = global_addresses(self.b, globals_, libs)

    def map_vmm(self) -> None:
        entries = self.plan.get("vmm", [])
        base = np.zeros(max((v["index"] for v in entries), default=-1) + 1, np.uint64)
        mine = {(m[0], m[1]): m for m in self._own_run().memory.vmm}
        for v in entries:
            m = mine.get((v["phase"], v["ordinal"]))
            if m is None or m[3] != v["size"]:
                raise RestoreError(
                    f"VMM reservation #{v['ordinal']} of phase {v['phase']!r} "
                    f"({v['size']} bytes) was not made alike in this start-up"
                )
            base[v["index"]] = m[2]
        self.bases[VMM] = base

    # ---- contents and graphs ----
    def write_contents(self) -> None:
        """Each replayed allocation's saved contents, its pointers relocated: in place when this
        returns."""
        todo = []
        for idx, c in self.plan["contents"].items():
            data = bytearray(c["data"])
            relocs = np.array([tuple(r) for r in c["relocs"]], RELOC)
            if not self.builder.relocate(data, relocs):
                raise RestoreError(f"allocation #{idx}'s saved contents point at nothing restored")
            todo.append((int(self.bases[DEVICE][int(idx)]), bytes(data)))
        # NOTE: queued on the legacy stream and waited for once, by the last copy (synchronous):
        # each synchronous copy is a round trip to the device (on simcuda, to its device thread).
        for dst, data in todo[:-1]:
            self.b.call("cudaMemcpyAsync", c_void_p(dst), data, c_size_t(len(data)), c_int(1),
                        c_void_p(0))  # fmt: skip
        for dst, data in todo[-1:]:
            self.b.memcpy_htod(dst, data)

    def build_graphs(self, funcs: np.ndarray, stream: int) -> list[int]:
        kernels, layout = pack_funcs(funcs, self.plan["funcs"])
        code, err, execs, self.graph_seconds = self.builder.build_plan(
            self.plan, kernels, layout, stream
        )
        self._execs += execs
        if code:
            gi = len(execs)
            nodes = graph_arrays(self.plan, gi)[0] if gi < len(self.plan["graphs"]) else []
            raise RestoreError(f"graph {gi}: {name_kernel(err, nodes, self.plan['funcs'])}")
        return execs

    def restore(self, stream: int) -> RestoreResult:
        t = {}
        t0 = time.perf_counter()
        self.map_allocations()
        t["allocations"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        funcs, methods = self.resolve_kernels()
        self.funcs = funcs  # the resolved kernels, for graphs built later (tessera.executor)
        self.map_globals()
        self.map_vmm()
        t["kernels"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        self.write_contents()
        execs = self.build_graphs(funcs, stream)
        t["graphs"] = time.perf_counter() - t0
        self.last_timings = t
        log.info(
            "restored %d graphs (%d nodes) in %.3f s; kernels: %s",
            len(execs),
            self.plan["num_nodes"],
            sum(t.values()),
            dict(methods),
        )
        return RestoreResult(execs, methods, t)
