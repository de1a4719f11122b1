"""Running one captured graph split across two devices (Tessera's executor), here two simcuda
processes, each restored from the same artifact and holding a full replica of the model's memory.

A placement assigns each kernel node of a decode graph to device 0 or 1. Each process builds, from
the artifact, one graph per maximal run of consecutive nodes placed on it (a segment), and the two
take turns in capture order: the owner of a segment runs it and then sends exactly the bytes that
later nodes on the other device read and it wrote last (read-after-write edges from the access
analysis, over a last-writer registry; a write counts as a read of the page, so a page written
on both sides is pulled before it is written again). At the end of the step each side sends what
it wrote last (the KV cache's new slots, the sampled tokens: replication with deltas), so both
replicas enter the next step equal. A dependency the analysis missed is a stale read on one side:
the tokens diverge from one device's.

Extents are the access analysis's: page-granular, per allocation (kind 0: device memory), mapped
to each process's own addresses through the restore's allocation map, so the two processes need
not share an address layout. The exchange is a local stream socket."""

from __future__ import annotations

import ctypes
import socket
import struct
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import msgpack
import numpy as np

from medusa.artifact.layout import pack_funcs
from medusa.errors import EngineDeadError
from medusa.restore.builder import graph_arrays
from medusa.restore.restorer import Restorer
from medusa.tessera.accesses import WRITE, Key, analyze
from medusa.tessera.depgraph import LastWriter, build
from medusa.trace.run_view import RunView

Range = tuple[Key, int, int]  # (allocation key, lo, hi) offsets within the allocation


class LinkError(EngineDeadError, ConnectionError):
    """The other side sent what the plan does not expect (another plan, or a corrupt stream):
    nothing of it was written."""


class Link:
    """Messages between the two processes: rank 0 listens on `path`, rank 1 connects. `timeout`
    bounds every wait on the other side (a send, a receive): socket.timeout (an OSError)."""

    def __init__(self, path: str | Path, rank: int, timeout: float = 60.0) -> None:
        self.rank = rank
        if rank == 0:
            server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            server.bind(str(path))
            server.listen(1)
            server.settimeout(timeout)
            self.sock, _ = server.accept()
            server.close()
        else:
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.sock.settimeout(timeout)
            self.sock.connect(str(path))

    def send(self, obj: object) -> None:
        data = msgpack.packb(obj, use_bin_type=True)
        self.sock.sendall(struct.pack("<Q", len(data)) + data)

    def recv(self) -> object:
        (n,) = struct.unpack("<Q", self._exactly(8))
        return msgpack.unpackb(self._exactly(n), raw=False, strict_map_key=False)

    def _exactly(self, n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise ConnectionError("the other device's process closed the exchange")
            buf += chunk
        return bytes(buf)

    def close(self) -> None:
        self.sock.close()


@dataclass
class Segment:
    device: int
    nodes: list[int]
    exec_: int = 0
    sends: list[Range] = field(default_factory=list)  # read later on the other device


Extents = dict[Key, list[tuple[int, int, int]]]


@dataclass
class Accesses:
    """Per graph, each kernel node's extents (from an instrumented recording of the start-up the
    artifact was made from), and where each allocation they name lives in this process."""

    graphs: list[list[Extents]]
    bases: dict[Key, int]
    dynamic: set[Key]  # accessed at offsets that depend on data: pinned, never exchanged
    constant: set[Key] = field(default_factory=set)  # the same in both processes (weights)

    @classmethod
    def of(
        cls,
        view: RunView,
        restorer: Restorer,
        dynamic_phases: tuple[str, ...] = ("kv_alloc",),
        constant_phases: tuple[str, ...] = ("weights_alloc",),
    ) -> Accesses:
        """dynamic_phases: allocations made in these start-up phases are reached at offsets
        the data decides (the KV cache, through the slot mapping and block tables): the extents
        one recorded step shows are not the next step's, so every kernel that touches them runs
        on one device (the pin) and they are never exchanged."""
        graphs = []
        for g, rows in enumerate(analyze(view)):
            if any(a is None or a.incomplete for a in rows):
                raise ValueError(f"graph {g}: some nodes have no complete access record")
            graphs.append([a.extents for a in rows])  # type: ignore[union-attr]
        keys = {k for rows in graphs for e in rows for k in e}
        if any(kind != 0 for kind, _ in keys):
            raise ValueError("only device memory is exchanged; a node reaches other memory")
        bases = {
            (0, i): restorer.address(view.allocs[i].phase, view.allocs[i].ordinal) for _, i in keys
        }
        dynamic = {k for k in keys if view.allocs[k[1]].phase in dynamic_phases}
        constant = {k for k in keys if view.allocs[k[1]].phase in constant_phases}
        return cls(graphs, bases, dynamic, constant)


def pinned_placement(
    placement: list[int], extents: list[Extents], dynamic: set[Key], pin: int
) -> list[int]:
    """`placement` with every node that touches a dynamic allocation on device `pin` (the same
    for every graph of the model, so the KV cache lives on one device) and each group of nodes
    that must share a device (indirect access) on its first member's device."""
    out = [pin if dynamic & set(e) else d for d, e in zip(placement, extents, strict=True)]
    for group in build(extents).pinned:
        first = min(group)
        for n in group:
            out[n] = out[first]
    return out


class PartitionedGraph:
    def __init__(
        self,
        restorer: Restorer,
        graph: int,
        accesses: Accesses,
        placement: list[int],
        rank: int,
        link: Link,
        stream: int,
        pin: int = 0,
        host_inputs: bool = False,
        max_nodes: int = 0,
    ) -> None:
        """host_inputs: only rank 0 runs the engine's host side (a server, with a follower
        process as device 1): the bytes device 1 reads before any node of the step writes them
        (what the host wrote: token ids, positions, block tables; weights aside) come from rank 0
        at the start of every step, and only device 1's deltas go back at its end. max_nodes:
        at most this many nodes per segment (0: no limit), so that between two segments on one
        device another request group's can run there (pipelining, medusa.tessera.pipeline)."""
        self.r, self.rank, self.link, self.stream = restorer, rank, link, stream
        self.extents, self.base = accesses.graphs[graph], accesses.bases
        self.host_inputs, self.constant = host_inputs, accesses.constant
        if host_inputs and pin != 0:
            raise ValueError("with the host on device 0 the KV cache's kernels run there (pin 0)")
        if len(placement) != len(self.extents):
            raise ValueError(f"{len(placement)} devices for {len(self.extents)} nodes")
        self.dynamic = accesses.dynamic
        self.place = pinned_placement(placement, self.extents, self.dynamic, pin)
        self.segments: list[Segment] = []
        for n, d in enumerate(self.place):
            last = self.segments[-1] if self.segments else None
            if last is None or last.device != d or len(last.nodes) == max_nodes:
                self.segments.append(Segment(d, []))
            self.segments[-1].nodes.append(n)
        self._plan_transfers()
        for s in self.segments:
            if s.device == rank:
                s.exec_ = self._build(graph, s.nodes)

    # ---- planning ----
    def _plan_transfers(self) -> None:
        """Fills each segment's sends and the end-of-step deltas (what each side wrote last)."""
        seg_of = {n: i for i, s in enumerate(self.segments) for n in s.nodes}
        last = LastWriter()
        sends: dict[int, set[Range]] = defaultdict(set)
        host = -1  # with host_inputs: rank 0's host, which wrote everything before the step
        inputs: set[Range] = set()
        if self.host_inputs:
            for key in {k for e in self.extents for k in e} - self.dynamic - self.constant:
                top = max(hi for e in self.extents for _, hi, _ in e.get(key, ()))
                last.write(key, 0, top, host)
        for n, all_ext in enumerate(self.extents):
            ext = {k: r for k, r in all_ext.items() if k not in self.dynamic}
            for key, ranges in ext.items():
                for lo, hi, _ in ranges:  # a write reads the page too (page-granular extents)
                    for a, b, w in last.overlaps(key, lo, hi):
                        if w == host:
                            if self.place[n] != 0:
                                inputs.add((key, a, b))
                        elif self.place[w] != self.place[n]:
                            sends[seg_of[w]].add((key, a, b))
            for key, ranges in ext.items():
                for lo, hi, mode in ranges:
                    if mode & WRITE:
                        last.write(key, lo, hi, n)
        for i, s in enumerate(self.segments):
            s.sends = sorted(sends[i])
        self.inputs = sorted(inputs)
        self.deltas: list[list[Range]] = [[], []]
        for key, segs in last.segs.items():
            for a, b, w in segs:
                if w != host and not (self.host_inputs and self.place[w] == 0):
                    self.deltas[self.place[w]].append((key, a, b))

    def _build(self, graph: int, keep: list[int]) -> int:
        """A graph exec of graph `graph`'s nodes `keep` only (edges among them), restored."""
        p = self.r.plan
        nodes, params, relocs, edges, attrs = graph_arrays(p, graph)
        new = {old: i for i, old in enumerate(keep)}
        edges = edges[np.isin(edges["from"], keep) & np.isin(edges["to"], keep)].copy()
        edges["from"] = [new[int(x)] for x in edges["from"]]
        edges["to"] = [new[int(x)] for x in edges["to"]]
        attrs = attrs[np.isin(attrs["node"], keep)].copy()
        attrs["node"] = [new[int(x)] for x in attrs["node"]]
        kernels, layout = pack_funcs(self.r.funcs, p["funcs"])
        code, err, exec_ = self.r.builder.build(
            nodes[keep], params, relocs, edges, attrs, kernels, layout, self.stream
        )
        if code:
            raise RuntimeError(f"segment of graph {graph}: {err}")
        self.r._execs.append(exec_)  # NOTE: destroyed with the restore's own graphs
        return exec_

    # ---- a step ----
    def run(self) -> None:
        """One launch of the graph, split: segments in turn, then the end-of-step deltas."""
        b = self.r.b
        if self.host_inputs:
            if self.rank == 0:
                self.link.send(self._read(self.inputs))
            else:
                self._write(self.link.recv(), self.inputs)
        pass_on = getattr(self.link, "pass_on", None)  # pipelining (medusa.tessera.pipeline)
        for i, s in enumerate(self.segments):
            if s.device == self.rank:
                b.graph_launch(s.exec_, self.stream)
                b.call("cudaStreamSynchronize", ctypes.c_void_p(self.stream))
                self.link.send(self._read(s.sends))
                nxt = self.segments[i + 1] if i + 1 < len(self.segments) else None
                if pass_on is not None and nxt is not None and nxt.device == self.rank:
                    pass_on()  # another request group's segment may run here first
            else:
                self._write(self.link.recv(), s.sends)
        mine = self._read(self.deltas[self.rank])
        if self.rank == 0:
            self.link.send(mine)
            self._write(self.link.recv(), self.deltas[1])
        else:
            theirs = self.link.recv()
            self.link.send(mine)
            self._write(theirs, self.deltas[0])

    def _read(self, ranges: list[Range]) -> list[list[object]]:
        return [
            [kind, idx, lo, self.r.b.memcpy_dtoh(self.base[(kind, idx)] + lo, hi - lo)]
            for (kind, idx), lo, hi in ranges
        ]

    def _write(self, items: object, expected: list[Range]) -> None:
        """Writes what the other side sent, once it is checked to be exactly the ranges the plan
        expects from it here (both sides plan alike): never bytes outside them."""
        if not isinstance(items, list) or len(items) != len(expected):
            raise LinkError(f"expected {len(expected)} ranges from the other device, not that")
        for item, ((kind, idx), lo, hi) in zip(items, expected, strict=True):
            if (
                not isinstance(item, list)
                or len(item) != 4
                or item[:3] != [kind, idx, lo]
                or not isinstance(item[3], bytes)
                or len(item[3]) != hi - lo
            ):
                raise LinkError(f"the other device sent something else than {hi - lo} bytes of "
                                f"allocation {idx} at {lo}")  # fmt: skip
        for kind, idx, lo, data in items:
            self.r.b.memcpy_htod(self.base[(kind, idx)] + lo, data)
