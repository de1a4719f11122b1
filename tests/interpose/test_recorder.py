"""The recorder under LD_PRELOAD on simcuda: what it writes, and that it changes nothing."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from medusa.trace import Ev, read_trace, recorder_env
from medusa.trace import records as R
from tests.conftest import lines

# Starts processes (see pyproject.toml's e2e marker): not in the fast subset.
pytestmark = pytest.mark.e2e

PROGRAMS = Path(__file__).parent / "programs"


@pytest.fixture(scope="module")
def recorded(cprog, run, tmp_path_factory):
    """The `recorded` program run plainly and under the recorder."""
    prog = cprog("recorded", src_dir=PROGRAMS)
    plain = run(prog)
    trace = tmp_path_factory.mktemp("rec") / "t.mtr"
    rec = run(prog, env=recorder_env(trace))
    return lines(plain.stdout), lines(rec.stdout), rec.stderr, read_trace(trace)


def test_program_output_is_identical_with_and_without_the_recorder(recorded):
    plain, rec, stderr, _ = recorded
    assert plain["checksum"] == rec["checksum"] == f"{sum(6.0 * i for i in range(1024)):.1f}"
    assert "medusa-interpose" not in stderr
    assert set(plain) == set(rec)


def test_the_exact_allocation_and_free_sequence_is_recorded(recorded):
    _, out, _, trace = recorded
    addr = {k: int(v) for k, v in out.items() if k in "abcdhe" or k == "va"}
    events = [
        e for e in trace.events(Ev.ALLOC, Ev.FREE, Ev.HOST_ALLOC, Ev.HOST_FREE) if e.result == 0
    ]
    seen = [(type(e).__name__, e.api, getattr(e, "addr", getattr(e, "host", 0))) for e in events]
    assert seen == [
        ("Alloc", "cudaMalloc", addr["a"]),
        ("Alloc", "cudaMalloc", addr["b"]),
        ("Free", "cudaFree", addr["a"]),
        ("Alloc", "cudaMalloc", addr["c"]),
        ("Alloc", "cuMemAlloc_v2", addr["d"]),
        ("HostAlloc", "cudaHostAlloc", addr["h"]),
        ("Alloc", "cudaMallocAsync", addr["e"]),
        ("Free", "cudaFreeAsync", addr["e"]),
        ("Free", "cudaFree", addr["b"]),
        ("Free", "cudaFree", addr["c"]),
        ("Free", "cuMemFree_v2", addr["d"]),
        ("HostFree", "cudaFreeHost", addr["h"]),
    ]
    frees = {e.addr: e for e in events if isinstance(e, R.Free)}
    allocs = {e.seq: e for e in events if isinstance(e, R.Alloc)}
    # each free names the allocation it ends, and its size, even when the address was reused
    for f in frees.values():
        assert allocs[f.alloc_seq].addr == f.addr and allocs[f.alloc_seq].size == f.size
    assert allocs[frees[addr["b"]].alloc_seq].size == 4096
    vmm = [type(e).__name__ for e in trace.events() if type(e).__name__.startswith("Vmm")]
    assert vmm == ["VmmReserve", "VmmCreate", "VmmMap", "VmmUnmap", "VmmRelease", "VmmFree"]
    assert trace.of(R.VmmReserve, Ev.VMM_RESERVE)[0].addr == addr["va"]


def test_a_capture_is_dumped_with_its_nodes_edges_and_the_launches_that_made_them(recorded):
    _, out, _, trace = recorded
    (end,) = [e for e in trace.of(R.CaptureEnd, Ev.CAPTURE_END)]
    assert end.graph == int(out["graph"]) and (end.num_nodes, end.num_edges) == (4, 3)
    nodes = sorted(trace.of(R.Node, Ev.NODE), key=lambda n: n.index)
    assert [n.type for n in nodes] == [2, 0, 0, 1]  # memset, kernel, kernel, memcpy
    memset, add, scale, copy = nodes
    assert memset.dst == int(out["c"]) and memset.width * memset.element_size == 4096
    assert (copy.dst, copy.src, copy.width) == (int(out["d"]), int(out["c"]), 4096)
    funcs = {f.func: f for f in trace.of(R.Func, Ev.FUNC)}
    assert funcs[add.func].name == "vector_add" and funcs[scale.func].name == "scale_inplace"
    # the raw parameter bytes, at the offsets the driver reports
    c = int(out["c"]).to_bytes(8, "little")
    b = int(out["b"]).to_bytes(8, "little")
    assert add.params == c + b + b + (1024).to_bytes(4, "little")
    assert funcs[add.func].params == ((0, 8), (8, 8), (16, 8), (24, 4))
    edges = {(e.src, e.dst) for e in trace.of(R.Edge, Ev.EDGE)}
    assert edges == {(memset.node, add.node), (add.node, scale.node), (scale.node, copy.node)}
    # node -> launch: the launch made while capturing names the node it became
    captured = [launch for launch in trace.of(R.Launch, Ev.LAUNCH) if launch.node]
    assert [x.node for x in captured] == [add.node, scale.node]
    assert captured[0].params == add.params
    inst = trace.of(R.Instantiate, Ev.INSTANTIATE)
    assert [i.graph for i in inst] == [end.graph]
    assert [g.exec for g in trace.of(R.GraphLaunch, Ev.GRAPH_LAUNCH)] == [inst[0].exec] * 2


def test_the_trace_names_the_device_and_the_kernels_image(recorded):
    _, _, _, trace = recorded
    (dev,) = trace.of(R.Device, Ev.DEVICE)
    assert "simcuda" in dev.name and dev.cc == (9, 0) and dev.total_mem > 0
    (load,) = trace.of(R.Load, Ev.LOAD)
    image = trace.image(load.sha256)
    assert image is not None and hashlib.sha256(image).hexdigest() == load.sha256
    assert len(image) == load.size
    stubs = {s.symbol: s for s in trace.of(R.Stub, Ev.STUB)}
    assert Path(stubs["vector_add"].object).name == "libsimcuda_testkernels.so"
    assert trace.complete


def test_a_launch_that_reached_the_driver_only_through_cuGetProcAddress(
    cprog, run, recorded, tmp_path
):
    _, _, _, first = recorded
    (load,) = first.of(R.Load, Ev.LOAD)
    image = first.images_dir / f"{load.sha256}.img"
    prog = cprog("procaddr", src_dir=PROGRAMS)
    trace = tmp_path / "p.mtr"
    res = run(prog, env={**recorder_env(trace), "IMAGE": str(image)})
    assert lines(res.stdout)["value"] == "4"
    t = read_trace(trace)
    launches = t.of(R.Launch, Ev.LAUNCH)
    # the per-thread variant stays the per-thread variant
    assert [x.api for x in launches] == ["cuLaunchKernel", "cuLaunchKernel_ptsz"]
    assert {x.func for x in launches} == {int(lines(res.stdout)["func"])}
    (mod,) = t.of(R.Load, Ev.LOAD)
    assert mod.api == "cuModuleLoad" and mod.file == str(image) and mod.sha256 == load.sha256


def test_a_capture_made_through_every_begin_capture_variant_a_lookup_hands_out(
    cprog, run, recorded, tmp_path
):
    # v1 begin-capture (CUDA 10.0, no mode), v2 handed out as an internal entry, and the
    # five-argument cuGraphInstantiate: a driver hands each out, and each must be recorded
    _, _, _, first = recorded
    (load,) = first.of(R.Load, Ev.LOAD)
    prog = cprog("procaddr_capture", src_dir=PROGRAMS)
    trace = tmp_path / "c.mtr"
    image = first.images_dir / f"{load.sha256}.img"
    res = run(prog, env={**recorder_env(trace), "IMAGE": str(image)})
    assert lines(res.stdout)["value"] == "4"
    assert "not recorded" not in res.stderr
    t = read_trace(trace)
    begins = t.of(R.CaptureBegin, Ev.CAPTURE_BEGIN)
    assert [b.api for b in begins] == ["cuStreamBeginCapture", "cuStreamBeginCapture_v2"]
    ends = t.of(R.CaptureEnd, Ev.CAPTURE_END)
    assert [e.num_nodes for e in ends] == [1, 1]
    # the launches were seen as captured, each the node of its graph
    nodes = {n.node for n in t.of(R.Node, Ev.NODE)}
    launches = t.of(R.Launch, Ev.LAUNCH)
    assert len(launches) == 2 and all(x.node in nodes for x in launches)
    assert [i.api for i in t.of(R.Instantiate, Ev.INSTANTIATE)] == ["cuGraphInstantiate_v2"] * 2
    assert [g.api for g in t.of(R.GraphLaunch, Ev.GRAPH_LAUNCH)] == ["cuGraphLaunch"] * 2


def test_ptsz_runtime_calls_and_a_hidden_module_kernel(cprog, run, tmp_path):
    prog = cprog("ptsz", src_dir=PROGRAMS, extra=("-DCUDA_API_PER_THREAD_DEFAULT_STREAM",))
    trace = tmp_path / "z.mtr"
    res = run(prog, env=recorder_env(trace))
    assert lines(res.stdout)["nodes"] == "2"
    t = read_trace(trace)
    assert [e.api for e in t.of(R.CaptureBegin, Ev.CAPTURE_BEGIN)] == [
        "cudaStreamBeginCapture_ptsz"
    ]
    funcs = {f.name: f for f in t.of(R.Func, Ev.FUNC)}
    blas = funcs["_ZN7testblas11sgemm_nn_f3EiiiPKfS1_Pf"]
    launches = {x.func: x for x in t.of(R.Launch, Ev.LAUNCH)}
    assert launches[funcs["scale_inplace"].func].api == "cudaLaunchKernel_ptsz"
    assert launches[blas.func].api == "cudaLaunchKernel" and launches[blas.func].stream == 2
    # found through the module of the library the runtime loaded (cuLibraryGetModule)
    assert blas.library == 0 and blas.module
    image = t.image(t.loaded_images()[blas.module])
    assert image is not None and b"testblas" in image
    # a hidden kernel has no exported symbol to name it
    stubs = {s.func: s for s in t.of(R.Stub, Ev.STUB)}
    assert stubs[blas.func].symbol == "" and stubs[funcs["scale_inplace"].func].symbol


def test_restore_mode_records_allocations_and_loads_but_no_work(cprog, run, tmp_path):
    prog = cprog("recorded", src_dir=PROGRAMS)
    trace = tmp_path / "r.mtr"
    run(prog, env=recorder_env(trace, mode="restore"))
    t = read_trace(trace)
    kinds = {Ev(int(x)).name for x in set(t.records["type"].tolist())}
    assert "LAUNCH" not in kinds and "NODE" not in kinds and "CAPTURE_BEGIN" not in kinds
    assert {"ALLOC", "FREE", "HOST_ALLOC", "VMM_MAP", "LOAD"} <= kinds


def test_an_existing_trace_is_not_overwritten_and_the_program_still_runs(cprog, run, tmp_path):
    prog = cprog("recorded", src_dir=PROGRAMS)
    trace = tmp_path / "x.mtr"
    trace.write_bytes(b"precious")
    res = run(prog, env=recorder_env(trace))
    assert trace.read_bytes() == b"precious"
    assert "remove it, or pick another name (put %p in MEDUSA_TRACE" in res.stderr
    assert "checksum" in lines(res.stdout)


def test_a_trace_and_its_side_files_are_this_users_only(cprog, run, tmp_path):
    """A trace holds the program's kernel images: under /tmp another user must not read it."""
    prog = cprog("recorded", src_dir=PROGRAMS)
    trace = tmp_path / "t.mtr"
    assert run(prog, env=recorder_env(trace)).returncode == 0
    images = trace.with_name(trace.name + ".images")
    made = [trace, trace.with_name(trace.name + ".blobs"), images, *images.iterdir()]
    assert len(made) > 3  # an image was saved too
    assert {p.stat().st_mode & 0o777 for p in made} == {0o600, 0o700}
    assert images.stat().st_mode & 0o777 == 0o700


def test_percent_p_gives_one_file_per_process(cprog, run, tmp_path):
    prog = cprog("recorded", src_dir=PROGRAMS)
    res = run(prog, env=recorder_env(tmp_path / "t-%p.mtr"))
    assert res.returncode == 0
    (f,) = [p for p in tmp_path.iterdir() if p.suffix == ".mtr"]
    assert read_trace(f).pid == int(f.stem.split("-")[1])


@pytest.mark.parametrize("side", [".blobs", ".images"])
def test_an_existing_side_file_or_link_is_never_written_through(cprog, run, tmp_path, side):
    prog = cprog("recorded", src_dir=PROGRAMS)
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    for name, make in (("file", lambda p: p.write_bytes(b"mine")), ("link", None)):
        trace = tmp_path / f"{name}{side}.mtr"
        planted = trace.with_name(trace.name + side)
        if make:
            make(planted)
        else:
            planted.symlink_to(victim if side == ".blobs" else tmp_path)
        res = run(prog, env=recorder_env(trace))
        assert "checksum" in lines(res.stdout), res.stderr
        assert f"cannot create {planted} " in res.stderr and "remove it" in res.stderr
        assert victim.read_bytes() == b"precious"
        assert not trace.exists(), "a refused recording leaves no half-made trace behind"
        if make:
            assert planted.read_bytes() == b"mine"
        else:
            assert planted.is_symlink()
    assert sorted(p.name for p in tmp_path.iterdir() if p.suffix == ".img") == []
