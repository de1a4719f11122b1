"""Kernel parameter words that differ between the two recordings: a pointer moves with its
allocation; a host value a closure carries (PyTorch's elementwise lambdas hold one the kernel
never reads, different in every process) is kept as recorded; a word among the device addresses
that no allocation explains is refused, naming the parameter."""

from __future__ import annotations

import struct
from functools import partial
from types import SimpleNamespace

import pytest

from medusa.materialize.analysis import (
    AddressIndex,
    MaterializeError,
    Unmoved,
    outside_both,
    relocate_words,
)
from medusa.materialize.graphs import Funcs, graph_plan
from medusa.trace.run_view import DEVICE, Alloc, Func

BASE_A, BASE_B = 0x7F93_15A0_0000, 0x7F93_15C0_1000  # run b: shifted, as materialize does
LAYOUT = [(0, 4), (8, 8), (16, 16)]  # int N, an 8-byte closure, std::array<char*, 2>


def _run(base: int) -> SimpleNamespace:
    allocs = [
        Alloc(0, "setup", 0, DEVICE, 1 << 20, "cudaMalloc", base, 1),
        Alloc(1, "setup", 1, DEVICE, 1 << 20, "cudaMalloc", base + (4 << 20), 2),
    ]
    return SimpleNamespace(allocs=allocs, globals=[], vmm=[])


def _relocate(pa: bytes, pb: bytes) -> list[tuple[int, int, int, int]]:
    ia, ib = AddressIndex(_run(BASE_A)), AddressIndex(_run(BASE_B))
    finds = (partial(ia.find, seq=10), partial(ib.find, seq=10))
    return relocate_words(
        pa, pb, *finds, "graph 0, node 4 (pow)", foreign=outside_both(ia, ib), layout=LAYOUT
    )


def _params(base: int, closure: int) -> bytes:
    return struct.pack("<iiQQQ", 4096, 0, closure, base + 0x4000, base + (4 << 20))


def test_a_closure_host_value_is_kept_and_the_pointers_relocated():
    # the values the H200 run recorded at byte 8 of PyTorch's pow kernel, one per process
    relocs = _relocate(_params(BASE_A, 0x385C9BD0), _params(BASE_B, 0x32328570))
    assert relocs == [(16, DEVICE, 0, 0x4000), (24, DEVICE, 1, 0)]


def test_an_unexplained_word_among_device_addresses_is_refused_naming_its_parameter():
    # between the two allocations: device address space, no allocation the recorder saw
    pa, pb = _params(BASE_A, BASE_A + (2 << 20)), _params(BASE_B, BASE_B + (3 << 20))
    with pytest.raises(MaterializeError, match=r"byte 8, in parameter 1 \(8 bytes at offset 8\)"):
        _relocate(pa, pb)


def test_every_refused_node_of_a_graph_is_named_at_once():
    pa, pb = _params(BASE_A, BASE_A + (2 << 20)), _params(BASE_B, BASE_B + (3 << 20))
    func = Func(name="pow", sha256="00", symbol="", layout=LAYOUT)

    def run(base: int, params: bytes) -> SimpleNamespace:
        node = {"type": 0, "func": 7, "grid": (1, 1, 1), "block": (32, 1, 1), "shared_bytes": 0}
        nodes = [SimpleNamespace(**node, params=params) for _ in range(3)]
        graph = {"nodes": nodes, "launch_seq": [10, 10, 10], "edges": [], "attrs": []}
        return SimpleNamespace(**vars(_run(base)), graphs=[graph], funcs={7: func})

    a, b = run(BASE_A, pa), run(BASE_B, pb)
    with pytest.raises(MaterializeError, match=r"node 0 .*and 2 more nodes: graph 0, node 1"):
        graph_plan(a, b, AddressIndex(a), AddressIndex(b), Funcs(), 0, Unmoved(a, b))


def test_a_scalar_that_differs_between_the_runs_is_refused():
    # a count N of 4096 in one run and 8192 in the other, in the word N shares with padding
    pa = struct.pack("<iiQQQ", 4096, 0, 0x385C9BD0, BASE_A + 0x4000, BASE_A + (4 << 20))
    pb = struct.pack("<iiQQQ", 8192, 0, 0x32328570, BASE_B + 0x4000, BASE_B + (4 << 20))
    with pytest.raises(MaterializeError, match=r"byte 0, in parameter 0 \(4 bytes at offset 0\)"):
        _relocate(pa, pb)


def test_a_small_value_in_an_8_byte_parameter_is_a_scalar_and_refused():
    with pytest.raises(MaterializeError, match="byte 8"):
        _relocate(_params(BASE_A, 4096), _params(BASE_B, 8192))


def test_without_the_kernels_parameter_layout_nothing_is_kept():
    ia, ib = AddressIndex(_run(BASE_A)), AddressIndex(_run(BASE_B))
    finds = (partial(ia.find, seq=10), partial(ib.find, seq=10))
    with pytest.raises(MaterializeError, match="byte 8"):
        relocate_words(_params(BASE_A, 0x385C9BD0), _params(BASE_B, 0x32328570), *finds,
                       "graph 0, node 4 (pow)", foreign=outside_both(ia, ib))  # fmt: skip
