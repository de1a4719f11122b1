"""PTX access instrumentation: every global access of our CUDA kernels gets a site, the
instrumented modules still assemble (ptxas, no GPU needed), and the record buffer reads back as
extents. Running it on a GPU is scripts/gpu/tessera_ptx.sh."""

from __future__ import annotations

import re
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from medusa.tessera.ptx import READ, WRITE, extents, initial_records, instrument

KERNELS = Path(__file__).resolve().parents[2] / "csrc" / "kernels"
SMALL = """
.version 9.0
.target sm_90
.address_size 64

.global .align 4 .f32 bias;

.visible .entry k(
	.param .u64 k_param_0
)
{
	.reg .pred 	%p<2>;
	.reg .f32 	%f<6>;
	.reg .b64 	%rd<4>;

	ld.param.u64 	%rd1, [k_param_0];
	cvta.to.global.u64 	%rd2, %rd1;
	ld.global.v4.f32 	{%f1, %f2, %f3, %f4}, [%rd2+16];
	@%p1 st.global.f32 	[%rd2+-4], %f1;
	ld.global.f32 	%f5, [bias];
	atom.global.add.f32 	%f5, [%rd2], %f1;
	ret;
}
"""


def test_each_access_gets_a_site_that_keeps_its_predicate_and_width():
    inst = instrument(SMALL)
    assert not inst.unsupported
    assert [(s.mode, s.width) for s in inst.sites] == [
        (READ, 16), (WRITE, 4), (READ, 4), (READ | WRITE, 4)
    ]  # fmt: skip
    lines = inst.ptx.splitlines()
    at = lines.index("\t@%p1 st.global.f32 \t[%rd2+-4], %f1;")
    assert all(line.startswith("\t@%p1 ") for line in lines[at - 6 : at])  # predicated, too
    assert "\t@%p1 add.s64 \t%macc0, %rd2, -4;" in lines
    assert "\tmov.u64 \t%macc0, bias+0;" in lines  # a module global's own address
    assert ".global .align 8 .u64 medusa_acc_buf;" in lines


PACKED_AND_GENERIC = """
.version 9.0
.target sm_90
.address_size 64

.visible .func put(
	.param .b64 put_param_0
)
{
	.reg .b32 	%r<3>;
	.reg .b64 	%rd<2>;

	ld.param.u64 	%rd1, [put_param_0];
	ld.volatile.u32 	%r1, [%rd1+4];
	st.u32 	[%rd1], %r1;
	ret;
}

.visible .entry k(
	.param .u64 k_param_0
)
{
	.reg .pred 	%p<2>;
	.reg .b32 	%r<4>;
	.reg .b64 	%rd<3>;

	ld.param.u64 	%rd1, [k_param_0];
	cvta.to.global.u64 	%rd2, %rd1;
	setp.eq.u64 	%p1, %rd1, 0;
	red.global.add.noftz.f16x2 	[%rd2], %r1;
	atom.global.add.noftz.bf16x2 	%r2, [%rd2+4], %r1;
	@!%p1 atom.add.u32 	%r3, [%rd1+8], 1;
	{ atom.add.noftz.f16x2 %r2,[%rd1],%r1; }
	ret;
}
"""


def test_packed_half_atomics_and_generic_accesses_get_sites():
    inst = instrument(PACKED_AND_GENERIC)
    assert not inst.unsupported
    rw = READ | WRITE
    assert [(s.function, s.mode, s.width, s.generic) for s in inst.sites] == [
        ("put", READ, 4, True), ("put", WRITE, 4, True),  # a .func given a pointer
        ("k", rw, 4, False), ("k", rw, 4, False),  # f16x2, bf16x2: two halves, 4 bytes
        ("k", rw, 4, True), ("k", rw, 4, True),  # generic atomics, one from inline assembly
    ]  # fmt: skip
    lines = inst.ptx.splitlines()
    at = lines.index("\t@!%p1 atom.add.u32 \t%r3, [%rd1+8], 1;")
    assert lines[at - 7 : at - 5] == [
        "\t@!%p1 isspacep.global \t%maccp, %macc0;",  # only global memory records, and only
        "\t@%maccp cvta.to.global.u64 \t%macc0, %macc0;",  # where the access itself runs
    ]


def test_a_global_or_generic_access_that_cannot_be_recorded_is_reported():
    body = (
        "\tld.u32 \t%r1, [flag];\n"  # generic through a symbol
        "\t{ .reg .b64 %t; mov.u64 %t, %rd1; ld.u32 %r2, [%t]; }\n"  # several on one line
        "\tld.global.u32 \t%r3, [%r4];\n"  # a 32-bit register address
        "\tld.shared.u32 \t%r5, [%rd1];\n"  # shared memory: not Tessera's concern
    )
    ptx = PACKED_AND_GENERIC.replace("\t{ atom.add.noftz.f16x2", body + "\t{ atom.add.noftz.f16x2")
    inst = instrument(ptx)
    assert [u.split(": ", 1)[1] for u in inst.unsupported] == [
        "ld.u32 \t%r1, [flag];",
        "{ .reg .b64 %t; mov.u64 %t, %rd1; ld.u32 %r2, [%t]; }",
        "ld.global.u32 \t%r3, [%r4];",
    ]


def test_records_read_back_as_extents():
    inst = instrument(SMALL)
    raw = bytearray(initial_records(len(inst.sites)))
    struct.pack_into("<QQ", raw, 0, 0x1010, 0x1410)  # site 0: 1 KiB read
    got = extents(bytes(raw), inst.sites)
    assert [(s.index, lo, hi) for s, lo, hi in got] == [(0, 0x1010, 0x1410)]  # untouched: none


needs_toolkit = pytest.mark.skipif(
    not (shutil.which("nvcc") and shutil.which("ptxas")), reason="no CUDA toolkit"
)


def _assembles(ptx: str, tmp_path: Path) -> None:
    src, cubin = tmp_path / "inst.ptx", tmp_path / "inst.cubin"
    src.write_text(ptx)
    res = subprocess.run(["ptxas", "-arch=sm_90", str(src), "-o", str(cubin)],
                         capture_output=True, text=True)  # fmt: skip
    assert res.returncode == 0, res.stderr


@pytest.mark.e2e
@needs_toolkit
def test_packed_and_generic_instrumentation_assembles(tmp_path):
    _assembles(instrument(PACKED_AND_GENERIC).ptx, tmp_path)


@pytest.mark.e2e
@needs_toolkit
def test_the_gpu_checks_kernel_instruments_completely_and_assembles(tmp_path):
    from medusa.tessera.ptx_check import KERNEL, compile_ptx

    inst = instrument(compile_ptx(KERNEL, "sm_90"))
    assert not inst.unsupported, inst.unsupported
    generic = [s for s in inst.sites if s.generic]
    assert {(s.mode, s.width) for s in generic} == {(WRITE, 4), (READ | WRITE, 4)}
    _assembles(inst.ptx, tmp_path)


@pytest.mark.e2e
@needs_toolkit
@pytest.mark.parametrize("name", ["engine", "mblas", "weaver", "hybridgemm", "testkernels"])
def test_our_kernels_instrument_completely_and_still_assemble(tmp_path, name):
    ptx = tmp_path / f"{name}.ptx"
    src = KERNELS / "cuda" / f"{name}.cu"
    subprocess.run(
        ["nvcc", "-ptx", "-arch=sm_90", f"-I{KERNELS}", str(src), "-o", str(ptx)], check=True
    )
    original = ptx.read_text()
    inst = instrument(original)
    assert not inst.unsupported, inst.unsupported
    access = re.compile(r"^\s*\{?\s*(@!?%p\d+\s+)?(ld|st|atom|red)(\.[\w:]+)*\s")
    other = re.compile(r"\.(shared|local|param|const)\b")
    lines = original.splitlines()
    accesses = sum(1 for line in lines if access.match(line) and not other.search(line))
    assert len(inst.sites) == accesses > 0
    _assembles(inst.ptx, tmp_path)
