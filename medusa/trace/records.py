"""Typed trace records: one frozen dataclass per event type, built from a raw record."""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass

from medusa.trace.format import Ev


@dataclass(slots=True)
class Event:
    seq: int
    api: str
    result: int
    t_ns: int


@dataclass(slots=True)
class Process(Event):
    pid: int
    ppid: int
    argv: tuple[str, ...]


@dataclass(slots=True)
class Device(Event):
    ordinal: int
    name: str
    uuid: bytes
    total_mem: int
    cc: tuple[int, int]
    driver_version: int
    runtime_version: int
    sm_count: int


@dataclass(slots=True)
class Alloc(Event):
    addr: int
    size: int
    stream: int
    flags: int


@dataclass(slots=True)
class Free(Event):
    addr: int
    size: int
    stream: int
    alloc_seq: int


@dataclass(slots=True)
class HostAlloc(Event):
    host: int
    size: int
    flags: int
    device: int


@dataclass(slots=True)
class HostFree(Event):
    host: int
    size: int
    alloc_seq: int


@dataclass(slots=True)
class HostRegister(Event):
    host: int
    size: int
    flags: int
    device: int


@dataclass(slots=True)
class VmmReserve(Event):
    addr: int
    size: int
    alignment: int
    requested: int


@dataclass(slots=True)
class VmmFree(Event):
    addr: int
    size: int


@dataclass(slots=True)
class VmmCreate(Event):
    handle: int
    size: int
    location: int


@dataclass(slots=True)
class VmmRelease(Event):
    handle: int


@dataclass(slots=True)
class VmmMap(Event):
    addr: int
    size: int
    offset: int
    handle: int


@dataclass(slots=True)
class VmmUnmap(Event):
    addr: int
    size: int


@dataclass(slots=True)
class Load(Event):
    handle: int
    size: int
    is_library: bool
    sha256: str
    file: str
    jit_options: tuple[tuple[int, int], ...]
    library_options: tuple[tuple[int, int], ...]
    module: int  # a library's module (cuLibraryGetModule), 0 if none


@dataclass(slots=True)
class Func(Event):
    func: int
    library: int
    module: int
    name: str
    params: tuple[tuple[int, int], ...]  # (offset, size) per parameter
    param_bytes: int


@dataclass(slots=True)
class Stub(Event):
    stub: int
    func: int
    symbol: str
    object: str


@dataclass(slots=True)
class Global(Event):
    addr: int
    size: int
    owner: int
    name: str


@dataclass(slots=True)
class FuncAttr(Event):
    func: int
    attr: int
    value: int


@dataclass(slots=True)
class Launch(Event):
    func: int
    stream: int
    node: int
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared_bytes: int
    params: bytes


@dataclass(slots=True)
class CaptureBegin(Event):
    stream: int
    mode: int


@dataclass(slots=True)
class CaptureEnd(Event):
    stream: int
    graph: int
    num_nodes: int
    num_edges: int


@dataclass(slots=True)
class Node(Event):
    graph: int
    node: int
    type: int
    index: int
    # kernel nodes
    func: int = 0
    grid: tuple[int, int, int] = (0, 0, 0)
    block: tuple[int, int, int] = (0, 0, 0)
    shared_bytes: int = 0
    params: bytes = b""
    # memcpy / memset nodes
    dst: int = 0
    src: int = 0
    width: int = 0
    height: int = 0
    depth: int = 0
    value: int = 0
    element_size: int = 0
    memory_types: tuple[int, int] = (0, 0)  # (src, dst) CUmemorytype


@dataclass(slots=True)
class Edge(Event):
    graph: int
    src: int
    dst: int
    from_port: int
    to_port: int
    type: int


@dataclass(slots=True)
class NodeAttr(Event):
    node: int
    attr: int
    value: bytes


@dataclass(slots=True)
class Instantiate(Event):
    graph: int
    exec: int
    flags: int


@dataclass(slots=True)
class GraphLaunch(Event):
    exec: int
    stream: int


@dataclass(slots=True)
class Mark(Event):
    phase: str


@dataclass(slots=True)
class Pause(Event):
    pass


@dataclass(slots=True)
class Resume(Event):
    pass


@dataclass(slots=True)
class End(Event):
    pass


@dataclass(slots=True)
class Stopped(Event):
    reason: str


@dataclass(slots=True)
class Content(Event):
    addr: int
    size: int
    alloc_seq: int
    data: bytes


@dataclass(slots=True)
class Access(Event):
    """A kernel run's accesses, reported by an instrumented back-end: extents (lo, hi, access)
    with access 1 read, 2 written, 3 both, in whole granules (pages on simcuda)."""

    func: int
    node: int  # the graph node it ran as; 0 when eager (its LAUNCH record follows)
    granularity: int
    incomplete: bool
    extents: tuple[tuple[int, int, int], ...]


@dataclass(slots=True)
class Apis(Event):
    names: tuple[str, ...]


def _lo(x: int) -> int:
    return x & 0xFFFFFFFF


def _hi(x: int) -> int:
    return x >> 32


def _geometry(a: int, b: int, c: int) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    return (_lo(a), _hi(a), _lo(b)), (_hi(b), _lo(c), _hi(c))


def _s(b: bytes) -> str:
    return b.decode("utf-8", "replace")


def _signed(x: int) -> int:
    return x - (1 << 64) if x >> 63 else x


def _options(blob: bytes) -> tuple[tuple[tuple[int, int], ...], tuple[tuple[int, int], ...], str]:
    if len(blob) < 8:
        return (), (), ""
    nj, nl = struct.unpack_from("<II", blob)
    pairs = [struct.unpack_from("<IxxxxQ", blob, 8 + 16 * i) for i in range(nj + nl)]
    return tuple(pairs[:nj]), tuple(pairs[nj:]), _s(blob[8 + 16 * (nj + nl) :])


def _load(h: Head, u: list[int], blob: bytes) -> Load:
    jit, lib, fname = _options(blob)
    digest = struct.pack("<4Q", *u[3:7]).hex()
    return Load(*h, u[0], u[1], bool(u[2]), digest, fname, jit, lib, u[7])


def _func(h: Head, u: list[int], blob: bytes) -> Func:
    n = u[3]
    pairs = tuple(struct.unpack_from("<II", blob, 8 * i) for i in range(n))
    return Func(*h, u[0], u[1], u[2], _s(blob[8 * n :]), pairs, u[4])


def _stub(h: Head, u: list[int], blob: bytes) -> Stub:
    sym, _, obj = blob.partition(b"\0")
    return Stub(*h, u[0], u[1], _s(sym), _s(obj))


def _device(h: Head, u: list[int], blob: bytes) -> Device:
    name, _, rest = blob.partition(b"\0")
    return Device(*h, u[0], _s(name), rest[:16], u[1], (u[2], u[3]), u[4], u[5], u[6])


def _launch(h: Head, u: list[int], blob: bytes) -> Launch:
    grid, block = _geometry(u[3], u[4], u[5])
    return Launch(*h, u[0], u[1], u[2], grid, block, u[6], blob)


def _access(h: Head, u: list[int], blob: bytes) -> Access:
    words = struct.unpack_from(f"<{3 * u[2]}Q", blob) if u[2] else ()
    ext = tuple(tuple(words[i : i + 3]) for i in range(0, len(words), 3))
    return Access(*h, u[0], u[1], u[3], bool(u[4] & 1), ext)  # type: ignore[arg-type]


def _node(h: Head, u: list[int], blob: bytes) -> Node:
    graph, node, ntype, index = u[0], u[1], _lo(u[2]), _hi(u[2])
    if ntype == 0:
        grid, block = _geometry(u[4], u[5], u[6])
        return Node(*h, graph, node, ntype, index, func=u[3], grid=grid, block=block,
                    shared_bytes=u[7], params=blob)  # fmt: skip
    if ntype == 1:
        kinds = (u[7] & 0xFF, u[7] >> 8)
        return Node(*h, graph, node, ntype, index, dst=u[3], src=u[4], width=u[5],
                    height=_lo(u[6]), depth=_hi(u[6]), memory_types=kinds)  # fmt: skip
    if ntype == 2:
        return Node(*h, graph, node, ntype, index, dst=u[3], value=u[4], element_size=u[5],
                    width=u[6], height=u[7])  # fmt: skip
    return Node(*h, graph, node, ntype, index)


Head = tuple[int, str, int, int]  # seq, api, result, t_ns
Builder = Callable[[Head, list[int], bytes], Event]

# Types whose fields are payload words as they are: (class, the words, in field order).
SIMPLE: dict[int, tuple[type[Event], tuple[int, ...]]] = {
    Ev.ALLOC: (Alloc, (0, 1, 2, 3)),
    Ev.FREE: (Free, (0, 1, 2, 3)),
    Ev.HOST_ALLOC: (HostAlloc, (0, 1, 2, 3)),
    Ev.HOST_FREE: (HostFree, (0, 1, 3)),
    Ev.HOST_REGISTER: (HostRegister, (0, 1, 2, 3)),
    Ev.VMM_RESERVE: (VmmReserve, (0, 1, 2, 3)),
    Ev.VMM_FREE: (VmmFree, (0, 1)),
    Ev.VMM_RELEASE: (VmmRelease, (0,)),
    Ev.VMM_MAP: (VmmMap, (0, 1, 2, 3)),
    Ev.VMM_UNMAP: (VmmUnmap, (0, 1)),
    Ev.CAPTURE_BEGIN: (CaptureBegin, (0, 1)),
    Ev.CAPTURE_END: (CaptureEnd, (0, 1, 2, 3)),
    Ev.EDGE: (Edge, (0, 1, 2, 3, 4, 5)),
    Ev.INSTANTIATE: (Instantiate, (0, 1, 2)),
    Ev.GRAPH_LAUNCH: (GraphLaunch, (0, 1)),
    Ev.PAUSE: (Pause, ()),
    Ev.RESUME: (Resume, ()),
    Ev.END: (End, ()),
}

BUILDERS: dict[int, Builder] = {
    Ev.PROCESS: lambda h, u, b: Process(*h, u[0], u[1], tuple(_s(a) for a in b.split(b"\0") if a)),
    Ev.DEVICE: _device,
    Ev.ALLOC: lambda h, u, b: Alloc(*h, u[0], u[1], u[2], u[3]),
    Ev.FREE: lambda h, u, b: Free(*h, u[0], u[1], u[2], u[3]),
    Ev.HOST_ALLOC: lambda h, u, b: HostAlloc(*h, u[0], u[1], u[2], u[3]),
    Ev.HOST_FREE: lambda h, u, b: HostFree(*h, u[0], u[1], u[3]),
    Ev.HOST_REGISTER: lambda h, u, b: HostRegister(*h, u[0], u[1], u[2], u[3]),
    Ev.VMM_RESERVE: lambda h, u, b: VmmReserve(*h, u[0], u[1], u[2], u[3]),
    Ev.VMM_FREE: lambda h, u, b: VmmFree(*h, u[0], u[1]),
    Ev.VMM_CREATE: lambda h, u, b: VmmCreate(*h, u[0], u[1], _signed(u[2])),
    Ev.VMM_RELEASE: lambda h, u, b: VmmRelease(*h, u[0]),
    Ev.VMM_MAP: lambda h, u, b: VmmMap(*h, u[0], u[1], u[2], u[3]),
    Ev.VMM_UNMAP: lambda h, u, b: VmmUnmap(*h, u[0], u[1]),
    Ev.LOAD: _load,
    Ev.FUNC: _func,
    Ev.STUB: _stub,
    Ev.GLOBAL: lambda h, u, b: Global(*h, u[0], u[1], u[2], _s(b)),
    Ev.FUNC_ATTR: lambda h, u, b: FuncAttr(*h, u[0], u[1], _signed(u[2])),
    Ev.LAUNCH: _launch,
    Ev.CAPTURE_BEGIN: lambda h, u, b: CaptureBegin(*h, u[0], u[1]),
    Ev.CAPTURE_END: lambda h, u, b: CaptureEnd(*h, u[0], u[1], u[2], u[3]),
    Ev.NODE: _node,
    Ev.EDGE: lambda h, u, b: Edge(*h, u[0], u[1], u[2], u[3], u[4], u[5]),
    Ev.NODE_ATTR: lambda h, u, b: NodeAttr(*h, u[0], u[1], b),
    Ev.INSTANTIATE: lambda h, u, b: Instantiate(*h, u[0], u[1], u[2]),
    Ev.GRAPH_LAUNCH: lambda h, u, b: GraphLaunch(*h, u[0], u[1]),
    Ev.MARK: lambda h, u, b: Mark(*h, _s(b)),
    Ev.PAUSE: lambda h, u, b: Pause(*h),
    Ev.RESUME: lambda h, u, b: Resume(*h),
    Ev.END: lambda h, u, b: End(*h),
    Ev.CONTENT: lambda h, u, b: Content(*h, u[0], u[1], u[2], b),
    Ev.STOPPED: lambda h, u, b: Stopped(*h, _s(b)),
    Ev.ACCESS: _access,
    Ev.APIS: lambda h, u, b: Apis(*h, tuple(_s(a) for a in b.split(b"\0")[: u[0]])),
}
