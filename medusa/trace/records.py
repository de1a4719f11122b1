"""Typed trace records: one dataclass per event type (medusa.trace.decode builds them from raw
records)."""

from __future__ import annotations

from dataclasses import dataclass


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
