"""numpy mirrors of csrc/restore/restore.h: how a plan's graphs are laid out in an artifact,
for the C builder that restores them."""

from __future__ import annotations

from itertools import accumulate

import numpy as np

NODE = np.dtype([("type", "<u4"), ("func", "<u4"), ("grid", "<u4", 3), ("block", "<u4", 3),
                 ("shared", "<u4"), ("param_off", "<u4"), ("param_len", "<u4"),
                 ("reloc_off", "<u4"), ("reloc_len", "<u4"), ("depth", "<u4"), ("width", "<u8"),
                 ("height", "<u8"), ("value", "<u8"), ("elem", "<u8")])  # fmt: skip
RELOC = np.dtype([("offset", "<u4"), ("kind", "<u4"), ("target", "<u8"), ("addend", "<i8")])
EDGE = np.dtype([("from", "<u4"), ("to", "<u4"), ("from_port", "u1"), ("to_port", "u1"),
                 ("type", "u1"), ("pad", "u1", 5)])  # fmt: skip
ATTR = np.dtype([("node", "<u4"), ("attr", "<u4"), ("value", "u1", 64), ("reloc_off", "<u4"),
                 ("reloc_len", "<u4")])  # fmt: skip
FUNC = np.dtype([("func", "<u8"), ("layout_off", "<u4"), ("layout_len", "<u4")])
PARAM = np.dtype([("offset", "<u4"), ("size", "<u4")])

assert (NODE.itemsize, RELOC.itemsize, EDGE.itemsize, ATTR.itemsize) == (88, 24, 16, 80)
assert (FUNC.itemsize, PARAM.itemsize) == (16, 8)


def pack_nodes(nodes: list[dict], param_base: int = 0, reloc_base: int = 0):  # type: ignore[no-untyped-def]
    """(node rows, params blob, reloc rows, scaled) for a list of node dicts from the analysis;
    scaled: [reloc row - reloc_base, slope] for each relocation whose offset follows a count
    (a 5-element relocation from the analysis, slope last)."""
    scaled: list[list[int]] = []
    rows = np.zeros(len(nodes), NODE)
    params = bytearray()
    relocs: list[tuple[int, ...]] = []
    for i, n in enumerate(nodes):
        r = rows[i]
        r["type"] = n["type"]
        r["func"] = n.get("func", 0)
        r["grid"], r["block"] = n.get("grid", (0, 0, 0)), n.get("block", (0, 0, 0))
        r["shared"] = n.get("shared", 0)
        p = n.get("params", b"")
        r["param_off"], r["param_len"] = param_base + len(params), len(p)
        params += p
        rel = n.get("relocs", [])
        r["reloc_off"], r["reloc_len"] = reloc_base + len(relocs), len(rel)
        for x in rel:
            if len(x) > 4:
                scaled.append([len(relocs), int(x[4])])
            relocs.append(tuple(x[:4]))
        r["width"], r["height"], r["depth"], r["value"] = (
            n.get("width", 0),
            n.get("height", 0),
            n.get("depth", 0),
            n.get("value", 0),
        )
        mt = n.get("memtypes", (0, 0))
        r["elem"] = n.get("elem", 0) if n["type"] == 2 else (mt[0] | mt[1] << 8)
    return rows, bytes(params), np.array(relocs, RELOC), scaled


def pack_edges(edges: list) -> np.ndarray:  # type: ignore[type-arg]
    out = np.zeros(len(edges), EDGE)
    for i, (a, b, fp, tp, t) in enumerate(edges):
        out[i]["from"], out[i]["to"], out[i]["from_port"], out[i]["to_port"], out[i]["type"] = (
            a, b, fp, tp, t)  # fmt: skip
    return out


def pack_attrs(attrs: list, reloc_base: int = 0) -> tuple[np.ndarray, np.ndarray]:  # type: ignore[type-arg]
    """(attribute rows, their relocations) for [node, attr, value, relocs] entries; relocs are
    the value's pointer words (an access-policy window's base_ptr), numbered from reloc_base."""
    out = np.zeros(len(attrs), ATTR)
    relocs: list[tuple[int, ...]] = []
    for i, (node, attr, value, *rest) in enumerate(attrs):
        out[i]["node"], out[i]["attr"] = node, attr
        v = np.frombuffer(bytes(value)[:64].ljust(64, b"\0"), np.uint8)
        out[i]["value"] = v
        rel = rest[0] if rest else []
        out[i]["reloc_off"], out[i]["reloc_len"] = reloc_base + len(relocs), len(rel)
        relocs += [tuple(x) for x in rel]
    return out, np.array(relocs, RELOC)


def pack_funcs(handles: np.ndarray, funcs: list[dict]) -> tuple[np.ndarray, np.ndarray]:
    """(kernel rows, parameter layout rows) for the C builder: each resolved handle with where
    its recorded (offset, size) parameters lie in the layout table."""
    sizes = [len(f["layout"]) for f in funcs]
    offsets = accumulate(sizes[:-1], initial=0) if sizes else []
    rows = np.array(list(zip(handles.tolist(), offsets, sizes, strict=True)), FUNC)
    flat = [tuple(p) for f in funcs for p in f["layout"]]
    return rows, np.array(flat, PARAM) if flat else np.zeros(0, PARAM)
