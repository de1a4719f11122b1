"""Raw trace records to typed ones (medusa.trace.records): the payload words and blob of each
event type, decoded. The reader looks a type up in SIMPLE (fields that are words as they are)
or BUILDERS."""

from __future__ import annotations

import struct
from collections.abc import Callable

from medusa.trace import records as R
from medusa.trace.format import Ev

Head = tuple[int, str, int, int]  # seq, api, result, t_ns
Builder = Callable[[Head, list[int], bytes], R.Event]


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


def image_digest(words: list[int]) -> str:
    """A LOAD record's image sha256 (u[3:7]), in hex."""
    return struct.pack("<4Q", *words).hex()


def _load(h: Head, u: list[int], blob: bytes) -> R.Load:
    jit, lib, fname = _options(blob)
    return R.Load(*h, u[0], u[1], bool(u[2]), image_digest(u[3:7]), fname, jit, lib, u[7])


def _func(h: Head, u: list[int], blob: bytes) -> R.Func:
    n = u[3]
    pairs = tuple(struct.unpack_from("<II", blob, 8 * i) for i in range(n))
    return R.Func(*h, u[0], u[1], u[2], _s(blob[8 * n :]), pairs, u[4])


def _stub(h: Head, u: list[int], blob: bytes) -> R.Stub:
    sym, _, obj = blob.partition(b"\0")
    return R.Stub(*h, u[0], u[1], _s(sym), _s(obj))


def _process(h: Head, u: list[int], blob: bytes) -> R.Process:
    return R.Process(*h, u[0], u[1], tuple(_s(a) for a in blob.split(b"\0") if a))


def _device(h: Head, u: list[int], blob: bytes) -> R.Device:
    name, _, rest = blob.partition(b"\0")
    return R.Device(*h, u[0], _s(name), rest[:16], u[1], (u[2], u[3]), u[4], u[5], u[6])


def _launch(h: Head, u: list[int], blob: bytes) -> R.Launch:
    grid, block = _geometry(u[3], u[4], u[5])
    return R.Launch(*h, u[0], u[1], u[2], grid, block, u[6], blob)


def _access(h: Head, u: list[int], blob: bytes) -> R.Access:
    words = struct.unpack_from(f"<{3 * u[2]}Q", blob) if u[2] else ()
    ext = tuple(tuple(words[i : i + 3]) for i in range(0, len(words), 3))
    return R.Access(*h, u[0], u[1], u[3], bool(u[4] & 1), ext)  # type: ignore[arg-type]


def _node(h: Head, u: list[int], blob: bytes) -> R.Node:
    graph, node, ntype, index = u[0], u[1], _lo(u[2]), _hi(u[2])
    if ntype == 0:
        grid, block = _geometry(u[4], u[5], u[6])
        return R.Node(*h, graph, node, ntype, index, func=u[3], grid=grid, block=block,
                    shared_bytes=u[7], params=blob)  # fmt: skip
    if ntype == 1:
        kinds = (u[7] & 0xFF, u[7] >> 8)
        return R.Node(*h, graph, node, ntype, index, dst=u[3], src=u[4], width=u[5],
                    height=_lo(u[6]), depth=_hi(u[6]), memory_types=kinds)  # fmt: skip
    if ntype == 2:
        return R.Node(*h, graph, node, ntype, index, dst=u[3], value=u[4], element_size=u[5],
                    width=u[6], height=u[7])  # fmt: skip
    return R.Node(*h, graph, node, ntype, index)


# Types whose fields are payload words as they are: (class, the words, in field order).
SIMPLE: dict[int, tuple[type[R.Event], tuple[int, ...]]] = {
    Ev.ALLOC: (R.Alloc, (0, 1, 2, 3)),
    Ev.FREE: (R.Free, (0, 1, 2, 3)),
    Ev.HOST_ALLOC: (R.HostAlloc, (0, 1, 2, 3)),
    Ev.HOST_FREE: (R.HostFree, (0, 1, 3)),
    Ev.HOST_REGISTER: (R.HostRegister, (0, 1, 2, 3)),
    Ev.VMM_RESERVE: (R.VmmReserve, (0, 1, 2, 3)),
    Ev.VMM_FREE: (R.VmmFree, (0, 1)),
    Ev.VMM_RELEASE: (R.VmmRelease, (0,)),
    Ev.VMM_MAP: (R.VmmMap, (0, 1, 2, 3)),
    Ev.VMM_UNMAP: (R.VmmUnmap, (0, 1)),
    Ev.CAPTURE_BEGIN: (R.CaptureBegin, (0, 1)),
    Ev.CAPTURE_END: (R.CaptureEnd, (0, 1, 2, 3)),
    Ev.EDGE: (R.Edge, (0, 1, 2, 3, 4, 5)),
    Ev.INSTANTIATE: (R.Instantiate, (0, 1, 2)),
    Ev.GRAPH_LAUNCH: (R.GraphLaunch, (0, 1)),
    Ev.PAUSE: (R.Pause, ()),
    Ev.RESUME: (R.Resume, ()),
    Ev.END: (R.End, ()),
}

BUILDERS: dict[int, Builder] = {
    Ev.PROCESS: _process,
    Ev.DEVICE: _device,
    Ev.ALLOC: lambda h, u, b: R.Alloc(*h, u[0], u[1], u[2], u[3]),
    Ev.FREE: lambda h, u, b: R.Free(*h, u[0], u[1], u[2], u[3]),
    Ev.HOST_ALLOC: lambda h, u, b: R.HostAlloc(*h, u[0], u[1], u[2], u[3]),
    Ev.HOST_FREE: lambda h, u, b: R.HostFree(*h, u[0], u[1], u[3]),
    Ev.HOST_REGISTER: lambda h, u, b: R.HostRegister(*h, u[0], u[1], u[2], u[3]),
    Ev.VMM_RESERVE: lambda h, u, b: R.VmmReserve(*h, u[0], u[1], u[2], u[3]),
    Ev.VMM_FREE: lambda h, u, b: R.VmmFree(*h, u[0], u[1]),
    Ev.VMM_CREATE: lambda h, u, b: R.VmmCreate(*h, u[0], u[1], _signed(u[2])),
    Ev.VMM_RELEASE: lambda h, u, b: R.VmmRelease(*h, u[0]),
    Ev.VMM_MAP: lambda h, u, b: R.VmmMap(*h, u[0], u[1], u[2], u[3]),
    Ev.VMM_UNMAP: lambda h, u, b: R.VmmUnmap(*h, u[0], u[1]),
    Ev.LOAD: _load,
    Ev.FUNC: _func,
    Ev.STUB: _stub,
    Ev.GLOBAL: lambda h, u, b: R.Global(*h, u[0], u[1], u[2], _s(b)),
    Ev.FUNC_ATTR: lambda h, u, b: R.FuncAttr(*h, u[0], u[1], _signed(u[2])),
    Ev.LAUNCH: _launch,
    Ev.CAPTURE_BEGIN: lambda h, u, b: R.CaptureBegin(*h, u[0], u[1]),
    Ev.CAPTURE_END: lambda h, u, b: R.CaptureEnd(*h, u[0], u[1], u[2], u[3]),
    Ev.NODE: _node,
    Ev.EDGE: lambda h, u, b: R.Edge(*h, u[0], u[1], u[2], u[3], u[4], u[5]),
    Ev.NODE_ATTR: lambda h, u, b: R.NodeAttr(*h, u[0], u[1], b),
    Ev.INSTANTIATE: lambda h, u, b: R.Instantiate(*h, u[0], u[1], u[2]),
    Ev.GRAPH_LAUNCH: lambda h, u, b: R.GraphLaunch(*h, u[0], u[1]),
    Ev.MARK: lambda h, u, b: R.Mark(*h, _s(b)),
    Ev.PAUSE: lambda h, u, b: R.Pause(*h),
    Ev.RESUME: lambda h, u, b: R.Resume(*h),
    Ev.END: lambda h, u, b: R.End(*h),
    Ev.CONTENT: lambda h, u, b: R.Content(*h, u[0], u[1], u[2], b),
    Ev.STOPPED: lambda h, u, b: R.Stopped(*h, _s(b)),
    Ev.ACCESS: _access,
    Ev.APIS: lambda h, u, b: R.Apis(*h, tuple(_s(a) for a in b.split(b"\0")[: u[0]])),
}
