"""Every ABI variant cuGetProcAddress can hand out for a hooked name (the PFN_<name>_v<version>
[_ptsz] typedefs of the cudaTypedefs.h we build against) is listed in hooks.def with that version
and per-thread flag: a variant missing there is one whose calls a driver can route around the
recorder (on CUDA 13, cuStreamBeginCapture asked for at 10.0 was such a one)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from medusa.cuda.paths import build_info

HOOKS = Path(__file__).parents[2] / "interpose" / "hooks.def"
ENTRY = re.compile(r"^[HV]\((\w+), (\w+), (\d+), ([01])", re.M)


def test_every_variant_the_headers_name_for_a_hooked_base_is_listed():
    typedefs = Path(str(build_info()["cuda_include_dir"])) / "cudaTypedefs.h"
    if not typedefs.exists():
        pytest.skip(f"{typedefs}: no cudaTypedefs.h in the headers the libraries were built with")
    pfn = {
        (base, int(version), bool(ptsz))
        for base, version, ptsz in re.findall(r"PFN_(\w+?)_v(\d+)(_ptsz)?\b", typedefs.read_text())
    }
    listed = {(b, int(v), p == "1"): s for s, b, v, p in ENTRY.findall(HOOKS.read_text())}
    driver = {k for k in listed if k[1]}  # the runtime's entries carry version 0
    assert len(driver) > 40
    # each listed variant exists, under the version and flag it is listed with
    assert sorted(driver - pfn) == []
    # and no variant of a listed base is missing
    bases = {k[0] for k in driver}
    assert sorted(k for k in pfn if k[0] in bases and k not in listed) == []
