"""The graphs a recording captured, read back from the records the recorder wrote at each
capture's end."""

from __future__ import annotations

import bisect
from collections import defaultdict

from medusa.trace import Ev, Trace
from medusa.trace import records as R


def captures(trace: Trace) -> list[dict]:
    """Successful captures, in order, with nodes (by index), edges, attributes and launch seqs.

    NOTE: a graph destroyed once instantiated (torch.cuda.graph does so) hands its handle, and its
    nodes' handles, to later captures: a node, edge or attribute record belongs to the capture
    whose end it follows (the recorder writes them after the end record), and a node's launch
    to the one that made it between that capture's begin and end."""
    ends: list[tuple[R.CaptureEnd, int]] = []
    begins: dict[int, int] = {}  # stream -> seq of its latest capture begin
    launches: dict[int, list[int]] = defaultdict(list)  # node handle -> seqs of its launches
    latest: dict[int, int] = {}  # graph handle -> its latest capture (index in ends)
    nodes: dict[int, list[R.Node]] = defaultdict(list)  # per capture, as `edges` and `attrs`
    edges: dict[int, list[R.Edge]] = defaultdict(list)
    attrs: dict[int, list[R.NodeAttr]] = defaultdict(list)
    owner: dict[int, int] = {}  # node handle -> the capture of its latest node record
    kinds = (Ev.CAPTURE_BEGIN, Ev.LAUNCH, Ev.CAPTURE_END, Ev.NODE, Ev.EDGE, Ev.NODE_ATTR)
    for e in trace.events(*kinds):
        if isinstance(e, R.CaptureBegin) and e.result == 0:
            begins[e.stream] = e.seq
        elif isinstance(e, R.Launch) and e.node:
            launches[e.node].append(e.seq)
        elif isinstance(e, R.CaptureEnd) and e.result == 0 and e.graph:
            latest[e.graph] = len(ends)
            ends.append((e, begins.get(e.stream, 0)))
        elif isinstance(e, R.Node) and e.graph in latest:
            owner[e.node] = latest[e.graph]
            nodes[latest[e.graph]].append(e)
        elif isinstance(e, R.Edge) and e.graph in latest:
            edges[latest[e.graph]].append(e)
        elif isinstance(e, R.NodeAttr) and e.node in owner:
            attrs[owner[e.node]].append(e)
    return [
        _capture(end, begin, nodes[c], edges[c], attrs[c], launches)
        for c, (end, begin) in enumerate(ends)
    ]


def _capture(
    end: R.CaptureEnd,
    begin: int,
    nodes: list[R.Node],
    edges: list[R.Edge],
    attrs: list[R.NodeAttr],
    launches: dict[int, list[int]],
) -> dict:
    ns = sorted(nodes, key=lambda n: n.index)
    pos = {n.node: n.index for n in ns}
    by_node: dict[int, list[R.NodeAttr]] = defaultdict(list)
    for a in attrs:
        by_node[a.node].append(a)

    def launch_seq(node: int) -> int:
        seqs = launches.get(node, [])
        i = bisect.bisect_left(seqs, end.seq) - 1
        return seqs[i] if i >= 0 and seqs[i] > begin else end.seq

    return {
        "seq": end.seq,
        "nodes": ns,
        "launch_seq": [launch_seq(n.node) for n in ns],
        "edges": sorted((pos[e.src], pos[e.dst], e.from_port, e.to_port, e.type) for e in edges),
        "attrs": [(pos[n.node], a.attr, a.value) for n in ns for a in by_node[n.node]],
    }
