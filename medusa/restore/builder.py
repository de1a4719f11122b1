"""The ctypes binding of libmedusa_restore (csrc/restore/): builds one graph from its packed arrays
(medusa.artifact.layout) and relocates saved buffer contents."""

from __future__ import annotations

import ctypes
import re
from ctypes import POINTER, c_char_p, c_int, c_size_t, c_uint, c_uint64, c_void_p
from typing import Any

import numpy as np

from medusa.artifact.layout import ATTR, EDGE, NODE, RELOC
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


class _Plan(ctypes.Structure):  # mr_plan; the arrays are the plan's bytes, kept alive by it
    _fields_ = [
        ("num_templates", c_uint),
        ("num_graphs", c_uint),
        ("templates", POINTER(c_char_p)),
        ("template_lens", POINTER(c_uint64)),
        ("graph_template", POINTER(c_uint)),
        ("graphs", POINTER(c_char_p)),
        ("graph_lens", POINTER(c_uint64)),
    ]


T_ARRAYS = ("nodes", "params", "relocs", "edges")  # mr_plan's order (MR_T_*)
G_ARRAYS = ("idx", "rows", "params", "relocs", "attrs")  # (MR_G_*)


def pack_plan(plan: dict[str, Any]) -> _Plan:
    """A checked plan's graphs as mr_build_plan takes them: pointers to each template's and
    graph's arrays where the plan holds them (nothing copied), and their lengths."""
    ts, gs = plan["templates"], plan["graphs"]
    t = [x[k] for x in ts for k in T_ARRAYS]
    g = [x[k] for x in gs for k in G_ARRAYS]
    # NOTE: one ctypes array per table (each made in C): a restore runs in a fresh process, where
    # each Python-level call costs its first time.
    nt, ng = max(len(t), 1), max(len(g), 1)
    return _Plan(len(ts), len(gs), (c_char_p * nt)(*t), (c_uint64 * nt)(*map(len, t)),
                 (c_uint * max(len(gs), 1))(*[x["template"] for x in gs]),
                 (c_char_p * ng)(*g), (c_uint64 * ng)(*map(len, g)))  # fmt: skip


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
