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


def test_records_read_back_as_extents():
    inst = instrument(SMALL)
    raw = bytearray(initial_records(len(inst.sites)))
    struct.pack_into("<QQ", raw, 0, 0x1010, 0x1410)  # site 0: 1 KiB read
    got = extents(bytes(raw), inst.sites)
    assert [(s.index, lo, hi) for s, lo, hi in got] == [(0, 0x1010, 0x1410)]  # untouched: none


@pytest.mark.skipif(not (shutil.which("nvcc") and shutil.which("ptxas")), reason="no CUDA toolkit")
@pytest.mark.parametrize("name", ["engine", "mblas", "weaver", "hybridgemm", "testkernels"])
def test_our_kernels_instrument_completely_and_still_assemble(tmp_path, name):
    ptx, cubin = tmp_path / f"{name}.ptx", tmp_path / f"{name}.cubin"
    src = KERNELS / "cuda" / f"{name}.cu"
    subprocess.run(
        ["nvcc", "-ptx", "-arch=sm_90", f"-I{KERNELS}", str(src), "-o", str(ptx)], check=True
    )
    original = ptx.read_text()
    inst = instrument(original)
    assert not inst.unsupported, inst.unsupported
    access = re.compile(r"^\s*(@!?%p\d+\s+)?(ld|st|atom|red)(\.\w+)*?\.global\.")
    accesses = sum(1 for line in original.splitlines() if access.match(line))
    assert len(inst.sites) == accesses > 0
    ptx.write_text(inst.ptx)
    res = subprocess.run(["ptxas", "-arch=sm_90", str(ptx), "-o", str(cubin)],
                         capture_output=True, text=True)  # fmt: skip
    assert res.returncode == 0, res.stderr
