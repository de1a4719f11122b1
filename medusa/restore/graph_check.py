"""The graph half of plan validation (medusa.restore.validate): every template's and graph's node
rows, relocations, edges and attributes, checked with numpy over all of them at once.

A graph is its template's rows with some rows replaced (`idx`, `rows`); its parameter bytes and
relocations are the template's followed by its own. Template rows are checked against the
template's tables, replacement rows against the graph's combined ones."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from medusa.artifact.layout import ATTR, EDGE, NODE, RELOC
from medusa.restore.plan_records import entries, one_of, raise_first, records
from medusa.restore.plan_tables import PlanTables
from medusa.trace import NodeType

KERNEL, MEMCPY, MEMSET, EMPTY = (int(NodeType[t]) for t in ("KERNEL", "MEMCPY", "MEMSET", "EMPTY"))
MAX_PARAM_BYTES = 32764  # CUDA's limit on a kernel's parameters (csrc/restore/restore.h)
MEMORY_TYPES = (1, 2, 4)  # CUmemorytype host, device, unified
TEMPLATE = {"nodes": bytes, "params": bytes, "relocs": bytes, "edges": bytes, "num_nodes": int}
GRAPH = {"template": int, "idx": bytes, "rows": bytes, "params": bytes, "relocs": bytes,
         "attrs": bytes}  # fmt: skip


def check_graphs(plan: dict[str, Any], tables: PlanTables) -> None:
    templates, graphs = plan["templates"], plan["graphs"]
    entries(templates, "templates", TEMPLATE)
    entries(graphs, "graphs", GRAPH)
    b = _unpack(templates, graphs)
    og = np.repeat(np.arange(len(graphs)), b.gk)  # each replacement row's graph
    _check_replaced(b, og)
    # every row, with the tables it indexes: params, relocations (template's, then graph's)
    rows = np.concatenate([b.tn_rows, b.over])
    own_t = np.concatenate([np.repeat(np.arange(len(templates)), b.tn), b.gt[og]])
    n_t = len(b.tn_rows)
    node_no = np.concatenate([np.arange(n_t) - b.t_start[own_t[:n_t]], b.idx.astype(np.int64)])

    def name(r: int) -> str:
        if r < n_t:
            return f"template {own_t[r]}, node {node_no[r]}"
        return f"graph {og[r - n_t]}, node {node_no[r]}"

    p_len, r_len, spans = _row_spans(b, own_t, og)
    _check_rows(rows, p_len, r_len, tables.layout_end, name)
    _check_reloc_counts(b, rows, own_t[:n_t], og)
    all_rel = np.concatenate([b.t_rel, b.g_rel])
    _check_relocs(rows, all_rel, spans, tables, name)
    _check_edges(b.edges, b.te, b.tn)
    _check_attrs(b.attrs, b.ga, b.tn[b.gt], b.tn_rows["type"], b.t_start[b.gt])
    attr_spans = (b.tr[b.gt], b.t_base[b.gt], b.g_base, b.gr)
    _check_attr_relocs(b.attrs, b.ga, attr_spans, all_rel, tables)


@dataclass(frozen=True)
class _Blobs:
    """Each kind of blob of the templates (t) and graphs (g), concatenated into one record array,
    and how many records each template or graph holds (tn, tr, te; gk, gr, ga), with tp and gp
    their parameter bytes and gt each graph's template."""

    tn_rows: np.ndarray
    tn: np.ndarray
    t_rel: np.ndarray
    tr: np.ndarray
    edges: np.ndarray
    te: np.ndarray
    tp: np.ndarray
    gt: np.ndarray
    over: np.ndarray  # replacement rows
    gk: np.ndarray
    idx: np.ndarray  # the template node each replaces
    g_rel: np.ndarray
    gr: np.ndarray
    attrs: np.ndarray
    ga: np.ndarray
    gp: np.ndarray

    @property
    def t_start(self) -> np.ndarray:
        """Each template's first row in tn_rows."""
        return np.concatenate([[0], np.cumsum(self.tn)[:-1]]).astype(np.int64)

    @property
    def t_base(self) -> np.ndarray:
        """Each template's first relocation in t_rel."""
        return np.concatenate([[0], np.cumsum(self.tr)[:-1]]).astype(np.int64)

    @property
    def g_base(self) -> np.ndarray:
        """Each graph's first relocation in t_rel followed by g_rel."""
        return len(self.t_rel) + np.concatenate([[0], np.cumsum(self.gr)[:-1]]).astype(np.int64)


def _unpack(templates: list[dict[str, Any]], graphs: list[dict[str, Any]]) -> _Blobs:
    """The blobs as records, each whole, each graph naming a template, idx matching rows."""
    tn_rows, tn = records([t["nodes"] for t in templates], NODE, "template {}: nodes")
    t_rel, tr = records([t["relocs"] for t in templates], RELOC, "template {}: relocs")
    edges, te = records([t["edges"] for t in templates], EDGE, "template {}: edges")
    tp = np.array([len(t["params"]) for t in templates], np.int64)
    gt = np.array([g["template"] for g in graphs], np.int64)
    raise_first((gt < 0) | (gt >= len(templates)), lambda g: f"graph {g}", "no such template")
    over, gk = records([g["rows"] for g in graphs], NODE, "graph {}: rows")
    idx, gi = records([g["idx"] for g in graphs], np.dtype("<u4"), "graph {}: idx")
    raise_first(gk != gi, lambda g: f"graph {g}", "idx and rows differ in length")
    g_rel, gr = records([g["relocs"] for g in graphs], RELOC, "graph {}: relocs")
    attrs, ga = records([g["attrs"] for g in graphs], ATTR, "graph {}: attrs")
    gp = np.array([len(g["params"]) for g in graphs], np.int64)
    raise_first(
        np.array([t["num_nodes"] for t in templates]) != tn, lambda t: f"template {t}", "num_nodes"
    )
    return _Blobs(
        tn_rows, tn, t_rel, tr, edges, te, tp, gt, over, gk, idx, g_rel, gr, attrs, ga, gp
    )


def _check_replaced(b: _Blobs, og: np.ndarray) -> None:
    """Replacement rows: at a node the template has, of the type the template gives it."""
    ot = b.gt[og]
    raise_first(b.idx >= b.tn[ot], lambda r: f"graph {og[r]}, idx {b.idx[r]}", "no such node")
    o_at = b.t_start[ot] + b.idx.astype(np.int64)
    raise_first(
        b.tn_rows["type"][o_at] != b.over["type"],
        lambda r: f"graph {og[r]}, node {b.idx[r]}",
        "a replaced node changes its type",
    )


def _row_spans(
    b: _Blobs, own_t: np.ndarray, og: np.ndarray
) -> tuple[np.ndarray, np.ndarray, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Per row: its parameter bytes, its relocations, and where they lie (how many are its
    template's, where the template's and the graph's begin in the combined table)."""
    n_t = len(b.tn_rows)
    p_len = b.tp[own_t] + np.concatenate([np.zeros(n_t, np.int64), b.gp[og]])
    r_split = b.tr[own_t]
    r_len = r_split + np.concatenate([np.zeros(n_t, np.int64), b.gr[og]])
    r_gbase = np.concatenate([np.zeros(n_t, np.int64), b.g_base[og]])
    return p_len, r_len, (r_split, b.t_base[own_t], r_gbase)


def _check_reloc_counts(b: _Blobs, rows: np.ndarray, own_t: np.ndarray, og: np.ndarray) -> None:
    """A template's or graph's nodes use no more relocations than it holds (a graph holds its
    template's too)."""
    nt, ng = len(b.tn), len(b.gt)
    owner = np.concatenate([own_t, nt + og])
    used = np.bincount(owner, rows["reloc_len"].astype(np.float64), nt + ng)
    raise_first(
        used > np.concatenate([b.tr, b.gr]) + np.concatenate([np.zeros(len(b.tr)), b.tr[b.gt]]),
        lambda o: f"template {o}" if o < nt else f"graph {o - nt}",
        "its nodes claim more relocations than it has",
    )


def _check_rows(
    rows: np.ndarray, p_len: np.ndarray, r_len: np.ndarray, layout_end: np.ndarray, name: Callable
) -> None:
    t = rows["type"]
    known = one_of(t, (KERNEL, MEMCPY, MEMSET, EMPTY))
    raise_first(~known, name, "type is not one restore builds")
    r_end = rows["reloc_off"].astype(np.int64) + rows["reloc_len"]
    raise_first(r_end > r_len, name, "reloc_off/reloc_len lie outside the relocations")
    k = t == KERNEL
    raise_first(k & (rows["func"] >= len(layout_end)), name, "func is not in the kernel table")
    p_end = rows["param_off"].astype(np.int64) + rows["param_len"]
    raise_first(k & (rows["param_len"] > MAX_PARAM_BYTES), name, "param_len is too large")
    raise_first(k & (p_end > p_len), name, "param_off/param_len lie outside the parameters")
    end = np.append(layout_end, -1)[np.minimum(rows["func"], len(layout_end))]
    p_n = rows["param_len"].astype(np.int64)
    raise_first(
        k & (end < 0) & (p_n > 0),
        name,
        "its kernel's parameter layout was not recorded (cuFuncGetParamInfo), so its parameters "
        "cannot be passed as kernelParams",
    )
    raise_first(k & (end > p_n), name, "its kernel's parameter layout runs past param_len")
    want = np.select([t == MEMCPY, t == MEMSET, t == EMPTY], [2, 1, 0], -1)
    raise_first(~k & (rows["reloc_len"] != want), name, "a copy or fill without its addresses")
    e = rows["elem"]
    raise_first((t == MEMSET) & ~one_of(e, (1, 2, 4)), name, "memset element size not 1, 2, 4")
    bad_types = ~one_of(e & 0xFF, MEMORY_TYPES) | ~one_of(e >> 8, MEMORY_TYPES)
    raise_first((t == MEMCPY) & bad_types, name, "memcpy memory types are not host/device")


def _check_relocs(
    rows: np.ndarray, all_rel: np.ndarray, split: tuple, tables: PlanTables, name: Callable
) -> None:
    """Each node's relocations: inside its parameters (kernels) or its two address words, and
    pointing into what they name with room for every byte a copy or fill touches."""
    r_split, r_tbase, r_gbase = split
    n = rows["reloc_len"].astype(np.int64)
    row = np.repeat(np.arange(len(rows)), n)
    local = np.arange(len(row)) - (np.cumsum(n) - n)[row] + rows["reloc_off"][row]
    at = np.where(local < r_split[row], r_tbase[row] + local, r_gbase[row] + local - r_split[row])
    rel = all_rel[at]
    t, off = rows["type"][row], rel["offset"].astype(np.int64)
    k = t == KERNEL
    bad = k & ((off % 8 != 0) | (off + 8 > rows["param_len"][row]))
    bad |= (t == MEMSET) & (off != 0)
    bad |= (t == MEMCPY) & ~one_of(off, (0, 8))
    raise_first(bad, lambda i: name(row[i]), "a relocated word lies outside the node")
    copy_offs = np.bincount(row, np.where(t == MEMCPY, off, 0), len(rows))
    raise_first((rows["type"] == MEMCPY) & (copy_offs != 8), name, "memcpy needs dst and src")
    room = tables.targets.room(rel["kind"], rel["target"], rel["addend"])
    raise_first(room < 0, lambda i: name(row[i]), "a relocation points outside its allocation")
    width, rows_n = rows["width"][row], np.maximum(rows["height"][row], 1)
    elem = np.where(t == MEMSET, rows["elem"][row], 1).astype(np.uint64)
    room_u = room.astype(np.uint64)
    fits = width <= room_u // np.maximum(elem, 1)
    fits &= rows_n <= room_u // np.maximum(width * elem * fits, 1)
    raise_first(~k & ~fits, lambda i: name(row[i]), "a copy or fill runs past its allocation")


def _check_attr_relocs(
    attrs: np.ndarray, ga: np.ndarray, split: tuple, all_rel: np.ndarray, tables: PlanTables
) -> None:
    """An attribute's relocations (an access-policy window's base_ptr): within its graph's
    relocations (template's, then its own), on a word of the 64-byte value, pointing into what
    they name."""
    t_len, t_base, g_base, g_len = split
    own = np.repeat(np.arange(len(ga)), ga)

    def name(i: int) -> str:
        return f"graph {own[i]}, attribute of node {attrs['node'][i]}"

    end = attrs["reloc_off"].astype(np.int64) + attrs["reloc_len"]
    raise_first(end > (t_len + g_len)[own], name, "its relocations lie outside the graph's")
    n = attrs["reloc_len"].astype(np.int64)
    row = np.repeat(np.arange(len(attrs)), n)
    local = np.arange(len(row)) - (np.cumsum(n) - n)[row] + attrs["reloc_off"][row]
    g = own[row]
    at = np.where(local < t_len[g], t_base[g] + local, g_base[g] + local - t_len[g])
    rel = all_rel[at]
    off = rel["offset"].astype(np.int64)
    raise_first((off % 8 != 0) | (off + 8 > 64), lambda i: name(row[i]), "a relocated word "
                 "lies outside the attribute value")  # fmt: skip
    room = tables.targets.room(rel["kind"], rel["target"], rel["addend"])
    raise_first(room < 0, lambda i: name(row[i]), "a relocation points outside its allocation")


def _check_edges(edges: np.ndarray, te: np.ndarray, tn: np.ndarray) -> None:
    own = np.repeat(np.arange(len(te)), te)
    first = np.concatenate([[0], np.cumsum(te)[:-1]]).astype(np.int64)

    def name(i: int) -> str:
        return f"template {own[i]}, edge {i - first[own[i]]}"

    nodes = tn[own]
    raise_first((edges["from"] >= nodes) | (edges["to"] >= nodes), name, "no such node")
    bad = (edges["type"] > 1) | (edges["to_port"] != 0) | (edges["from_port"] > 2)
    raise_first(bad, name, "edge type or port is not one CUDA defines")


def _check_attrs(
    attrs: np.ndarray, ga: np.ndarray, g_nodes: np.ndarray, types: np.ndarray, g_start: np.ndarray
) -> None:
    own = np.repeat(np.arange(len(ga)), ga)

    def name(i: int) -> str:
        return f"graph {own[i]}, attribute of node {attrs['node'][i]}"

    raise_first(attrs["node"] >= g_nodes[own], name, "no such node")
    kernel = types[g_start[own] + attrs["node"].astype(np.int64)] == KERNEL
    raise_first(~kernel, name, "not a kernel node")
    raise_first((attrs["attr"] < 1) | (attrs["attr"] >= 64), name, "not a CUDA attribute id")
