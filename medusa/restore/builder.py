"""The ctypes binding of libmedusa_restore (csrc/restore/): builds one graph from its packed arrays
(medusa.artifact.layout) and relocates saved buffer contents."""

from __future__ import annotations

import ctypes
import re
from ctypes import POINTER, c_char_p, c_int, c_size_t, c_uint, c_uint64, c_void_p
from itertools import accumulate
from typing import Any

import numpy as np

from medusa.artifact.layout import ATTR, EDGE, GRAPH_REF, NODE, RELOC, TEMPLATE_REF
from medusa.cuda.errors import LibraryVersionError
from medusa.cuda.native import restore_library
from medusa.restore.errors import RestoreError
from medusa.trace import NodeType

KINDS = 4  # relocation kinds (medusa.trace.run_view): DEVICE, HOST, GLOBAL, VMM
_ROW = np.dtype((np.void, NODE.itemsize))  # a node row as opaque bytes


class _Graph(ctypes.Structure):
    _fields_ = [
        ("nodes", c_void_p),
        ("num_nodes", c_uint),
        ("params", c_void_p),
        ("params_len", c_uint64),
        ("relocs", c_void_p),
        ("num_relocs", c_uint),
        ("edges", c_void_p),
        ("num_edges", c_uint),
        ("attrs", c_void_p),
        ("num_attrs", c_uint),
    ]


class _Kernels(ctypes.Structure):
    _fields_ = [
        ("funcs", c_void_p),
        ("num_funcs", c_uint),
        ("num_params", c_uint),
        ("params", c_void_p),
    ]


class _Plan(ctypes.Structure):  # mr_plan; the buffers are bytes that the structure keeps alive
    _fields_ = [
        ("templates", c_char_p),
        ("num_templates", c_uint),
        ("graphs", c_char_p),
        ("num_graphs", c_uint),
        ("nodes", c_char_p),
        ("num_nodes", c_uint),
        ("idx", c_char_p),
        ("rows", c_char_p),
        ("num_rows", c_uint),
        ("params", c_char_p),
        ("params_len", c_uint64),
        ("relocs", c_char_p),
        ("num_relocs", c_uint),
        ("edges", c_char_p),
        ("num_edges", c_uint),
        ("attrs", c_char_p),
        ("num_attrs", c_uint),
    ]


def _spans(blobs: list[bytes], size: int, start: int = 0) -> tuple[list[int], list[int]]:
    """Where each blob's records lie once the blobs are joined after START records."""
    counts = [len(b) // size for b in blobs]
    return list(accumulate(counts[:-1], initial=start)) if counts else [], counts


def pack_plan(plan: dict[str, Any]) -> _Plan:
    """A checked plan's graphs as mr_build_plan takes them: each kind of array of every template
    and graph joined into one buffer, and where each one's lie."""
    ts, gs = plan["templates"], plan["graphs"]
    t_params, g_params = [t["params"] for t in ts], [g["params"] for g in gs]
    t_relocs, g_relocs = [t["relocs"] for t in ts], [g["relocs"] for g in gs]
    nodes, edges = [t["nodes"] for t in ts], [t["edges"] for t in ts]
    idx, rows, attrs = [g["idx"] for g in gs], [g["rows"] for g in gs], [g["attrs"] for g in gs]
    tp, tr = _spans(t_params, 1), _spans(t_relocs, RELOC.itemsize)
    gp = _spans(g_params, 1, sum(tp[1]))
    gr = _spans(g_relocs, RELOC.itemsize, sum(tr[1]))
    tn, te = _spans(nodes, NODE.itemsize), _spans(edges, EDGE.itemsize)
    gi, ga = _spans(idx, 4), _spans(attrs, ATTR.itemsize)
    templates = b"".join(map(TEMPLATE_REF.pack, *tn, *tp, *tr, *te))
    templ = [g["template"] for g in gs]
    graphs = b"".join(map(GRAPH_REF.pack, templ, [0] * len(gs), *gi, *gp, *gr, *ga))
    joined = [b"".join(x) for x in (nodes, idx, rows, t_params + g_params, t_relocs + g_relocs,
                                    edges, attrs)]  # fmt: skip
    sizes = (NODE.itemsize, 4, NODE.itemsize, 1, RELOC.itemsize, EDGE.itemsize, ATTR.itemsize)
    n_nodes, n_idx, n_rows, n_params, n_relocs, n_edges, n_attrs = (
        len(b) // size for b, size in zip(joined, sizes, strict=True)
    )
    j_nodes, j_idx, j_rows, j_params, j_relocs, j_edges, j_attrs = joined
    # NOTE: as many rows as both idx and rows hold: a row past either is refused in C.
    return _Plan(templates, len(ts), graphs, len(gs), j_nodes, n_nodes,
                 j_idx, j_rows, min(n_idx, n_rows), j_params, n_params, j_relocs, n_relocs,
                 j_edges, n_edges, j_attrs, n_attrs)  # fmt: skip


def _kernels(funcs: np.ndarray, layout: np.ndarray) -> _Kernels:
    return _Kernels(
        funcs.ctypes.data if len(funcs) else None,
        len(funcs),
        len(layout),
        layout.ctypes.data if len(layout) else None,
    )


def load_library() -> ctypes.CDLL:
    """libmedusa_restore; RestoreError when it was built from other sources than this package."""
    try:
        return restore_library()
    except LibraryVersionError as e:
        raise RestoreError(str(e)) from None


class GraphBuilder:
    """One graph, or a plan's graphs: returns the CUresult and the C side's message, never
    raises."""

    def __init__(self, bases: list[np.ndarray]) -> None:
        self.lib = load_library()
        self.lib.mr_build_graph.restype = c_int
        self.lib.mr_build_graph.argtypes = [
            POINTER(_Graph),
            POINTER(_Kernels),
            c_void_p,
            c_void_p,
            c_void_p,
            POINTER(c_void_p),
            c_char_p,
            c_size_t,
        ]
        self.lib.mr_build_plan.restype = c_int
        self.lib.mr_build_plan.argtypes = [
            POINTER(_Plan),
            POINTER(_Kernels),
            c_void_p,
            c_void_p,
            c_void_p,
            c_void_p,
            c_void_p,
            POINTER(c_uint),
            c_char_p,
            c_size_t,
        ]
        self.lib.mr_relocate.restype = c_int
        self.lib.mr_relocate.argtypes = [c_void_p, c_size_t, c_void_p, c_uint, c_void_p, c_void_p]
        self.bases = bases

    def _tables(self) -> tuple[Any, Any]:
        ptrs = (c_void_p * KINDS)(*[b.ctypes.data if b.size else None for b in self.bases])
        sizes = (c_uint64 * KINDS)(*[b.size for b in self.bases])
        return ptrs, sizes

    def build(
        self,
        nodes: np.ndarray,
        params: np.ndarray,
        relocs: np.ndarray,
        edges: np.ndarray,
        attrs: np.ndarray,
        funcs: np.ndarray,
        layout: np.ndarray,
        stream: int,
    ) -> tuple[int, str, int]:
        """(CUresult, message, graph exec) for one graph; arrays in the layout's dtypes (funcs
        and layout from layout.pack_funcs)."""
        ptrs, sizes = self._tables()
        kernels = _kernels(funcs, layout)
        spec = _Graph(
            nodes.ctypes.data,
            len(nodes),
            params.ctypes.data,
            len(params),
            relocs.ctypes.data if len(relocs) else None,
            len(relocs),
            edges.ctypes.data if len(edges) else None,
            len(edges),
            attrs.ctypes.data if len(attrs) else None,
            len(attrs),
        )
        exec_ = c_void_p()
        err = ctypes.create_string_buffer(512)
        code = self.lib.mr_build_graph(
            ctypes.byref(spec),
            ctypes.byref(kernels),
            ptrs,
            sizes,
            c_void_p(stream),
            ctypes.byref(exec_),
            err,
            512,
        )
        return code, err.value.decode(errors="replace"), int(exec_.value or 0)

    def build_plan(
        self, plan: dict[str, Any], funcs: np.ndarray, layout: np.ndarray, stream: int
    ) -> tuple[int, str, list[int], list[float]]:
        """(CUresult, message, graph execs, seconds per graph) for every graph of a checked plan,
        in one call; on failure the execs built before the graph that failed (graph len(execs))."""
        ptrs, sizes = self._tables()
        n = len(plan["graphs"])
        execs, secs, built = (c_void_p * max(n, 1))(), (ctypes.c_double * max(n, 1))(), c_uint()
        err = ctypes.create_string_buffer(512)
        code = self.lib.mr_build_plan(
            ctypes.byref(pack_plan(plan)),
            ctypes.byref(_kernels(funcs, layout)),
            ptrs,
            sizes,
            c_void_p(stream),
            execs,
            secs,
            ctypes.byref(built),
            err,
            512,
        )
        done = built.value
        return code, err.value.decode(errors="replace"), [e or 0 for e in execs[:done]], secs[:done]

    def relocate(self, data: bytearray, relocs: np.ndarray) -> bool:
        """Patches the pointer words of a saved buffer; False if one points at nothing."""
        if not len(relocs):
            return True
        relocs = np.ascontiguousarray(relocs, RELOC)
        ptrs, sizes = self._tables()
        buf = (ctypes.c_uint8 * len(data)).from_buffer(data)
        n = self.lib.mr_relocate(buf, len(data), relocs.ctypes.data, len(relocs), ptrs, sizes)
        return n == 0


def graph_arrays(plan: dict[str, Any], gi: int) -> tuple[np.ndarray, ...]:
    """Graph GI of a checked plan as the builder takes it: (nodes, params, relocs, edges, attrs),
    its template's rows with the graph's own rows put in their places."""
    g = plan["graphs"][gi]
    t = plan["templates"][g["template"]]
    if g["idx"]:
        nodes = np.frombuffer(bytearray(t["nodes"]), NODE)
        # NOTE: rows copied as opaque records: a structured assignment converts field by field,
        # ten times slower (a visible share of a restore's cost).
        nodes.view(_ROW)[np.frombuffer(g["idx"], "<u4")] = np.frombuffer(g["rows"], _ROW)
    else:
        nodes = np.frombuffer(t["nodes"], NODE)
    params = np.frombuffer(t["params"] + g["params"] + b"\0", np.uint8)
    relocs = np.frombuffer(t["relocs"] + g["relocs"], RELOC)
    return nodes, params, relocs, np.frombuffer(t["edges"], EDGE), np.frombuffer(g["attrs"], ATTR)


def name_kernel(err: str, nodes: np.ndarray, funcs: list[dict[str, Any]]) -> str:
    """mr_build_graph's message, with the kernel named when it blames a kernel node ("node 12
    (type 0): ..."), so that a failure on a GPU says which kernel the driver refused."""
    m = re.match(r"node (\d+) ", err)
    if not m or int(m[1]) >= len(nodes) or nodes[int(m[1])]["type"] != NodeType.KERNEL:
        return err
    f = int(nodes[int(m[1])]["func"])
    return f"{err} [kernel {funcs[f]['name']}]" if f < len(funcs) else err
