"""The access analysis against the two-run pointer classification: a parameter word the diff
calls a pointer must be dereferenced by the kernel, and a parameter word the kernel dereferences
must be one the diff calls a pointer. Materialize warns on a disagreement (refuses with
--strict)."""

from __future__ import annotations

from dataclasses import dataclass

from medusa.materialize.analysis import AddressIndex, Unmoved, relocate_words
from medusa.tessera.accesses import NodeAccesses, analyze
from medusa.trace import NodeType
from medusa.trace.run_view import KIND_NAMES, RunView


@dataclass(frozen=True)
class Disagreement:
    graph: int
    node: int
    kernel: str
    byte: int  # offset of the parameter word
    pointer: bool  # what the two-run diff says
    dereferenced: bool  # what the access analysis says
    target: str  # what the word points into

    def __str__(self) -> str:
        what = (
            "is a pointer (it moves between the runs) that the kernel never dereferences"
            if self.pointer
            else "is dereferenced by the kernel but stays put between the runs (a constant)"
        )
        return (
            f"graph {self.graph}, node {self.node} ({self.kernel}), parameter byte "
            f"{self.byte} -> {self.target}: {what}"
        )


@dataclass(frozen=True)
class CrossCheck:
    nodes_checked: int
    nodes_unknown: int  # kernel nodes with no instrumented run recorded
    disagreements: list[Disagreement]

    @property
    def agrees(self) -> bool:
        return not self.disagreements


def _pointer_words(
    a: RunView, b: RunView, ia: AddressIndex, ib: AddressIndex, g: int, i: int, unmoved: Unmoved
) -> set[int]:
    na, nb = a.graphs[g]["nodes"][i], b.graphs[g]["nodes"][i]
    sa, sb = a.graphs[g]["launch_seq"][i], b.graphs[g]["launch_seq"][i]
    relocs = relocate_words(
        na.params,
        nb.params,
        lambda v: ia.find(v, sa),
        lambda v: ib.find(v, sb),
        f"graph {g}, node {i}",
        unmoved,
    )
    return {r[0] for r in relocs}


def _node(acc: NodeAccesses, pointers: set[int]) -> list[Disagreement]:
    deref = acc.dereferenced
    out = []
    for off in sorted(pointers | deref):
        if (off in pointers) != (off in deref):
            k, idx, addend = acc.pointers.get(off, (0, -1, 0))
            target = f"{KIND_NAMES[k]} #{idx} + {addend}" if idx >= 0 else "no live allocation"
            out.append(
                Disagreement(
                    acc.graph, acc.node, acc.kernel, off, off in pointers, off in deref, target
                )
            )
    return out


def crosscheck(a: RunView, b: RunView) -> CrossCheck:
    """Run A must be recorded with access instrumentation; B is the shifted second recording."""
    accesses = analyze(a)
    ia, ib = AddressIndex(a), AddressIndex(b)
    unmoved = Unmoved(a, b)
    checked = unknown = 0
    found: list[Disagreement] = []
    for g, row in enumerate(accesses):
        for i, acc in enumerate(row):
            if a.graphs[g]["nodes"][i].type != NodeType.KERNEL:
                continue
            if acc is None or acc.incomplete:
                unknown += 1
                continue
            checked += 1
            found += _node(acc, _pointer_words(a, b, ia, ib, g, i, unmoved))
    return CrossCheck(checked, unknown, found)
