"""PTX instrumentation of kernels' global memory accesses (Tessera's method, for `.cu` kernels on a
GPU, where simcuda's page protection is not there to watch them).

`instrument(ptx)` rewrites a module so that each global load, store and atomic (an access *site*)
also folds the bytes it touches into a per-site record with `atom.global.min/max`: the lowest
address and the highest end address any thread accessed there. The records live in a buffer
the host allocates and points the module's `medusa_acc_buf` global at; after the kernel, each
touched site gives an extent [lo, hi) read, written or both, which the host maps onto its
allocations as the simcuda analysis does. Instrumented code keeps each access's predicate, so a
thread that skips an access records nothing.

Accesses through a register (`[%rdN+off]`, what nvcc emits for pointers) or a module global
(`[sym+off]`) are instrumented; any other global access (`cp.async`, a 32-bit register address)
is returned as unsupported, so that nothing is missed silently."""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass

BUFFER = "medusa_acc_buf"
RECORD_BYTES = 16  # per site: u64 min address, u64 max end address
READ, WRITE = 1, 2
_UNTOUCHED = (2**64 - 1, 0)

_ACCESS = re.compile(
    r"^(?P<indent>\s*)(?P<pred>@!?%p\d+\s+)?(?P<op>ld|st|atom|red)(?:\.(?:volatile|relaxed|acquire"
    r"|release|weak|sys|gpu|cta))*\.global(?P<mods>(?:\.\w+)*)"
    r"\s+(?P<args>[^;]*);"
)
_ADDRESS = re.compile(r"\[(?P<reg>%rd\d+|[A-Za-z_$][\w$]*)(?:\+(?P<off>-?\d+))?\]")
_ENTRY = re.compile(r"^\s*\.(?:visible\s+|weak\s+)?(?:\.)?(?:entry|func)\s+(?:\([^)]*\)\s*)?(\w+)")
_WIDTH = {"8": 1, "16": 2, "32": 4, "64": 8, "128": 16}


@dataclass(frozen=True)
class Site:
    index: int
    function: str
    line: int  # in the original PTX, 1-based
    mode: int  # READ, WRITE or both
    width: int  # bytes one thread accesses


@dataclass(frozen=True)
class Instrumented:
    ptx: str
    sites: list[Site]
    unsupported: list[str]  # global accesses left as they were (file line: text)


def _width(mods: str) -> int:
    parts = mods.strip(".").split(".")
    lanes = next((int(p[1:]) for p in parts if re.fullmatch(r"v[248]", p)), 1)
    bits = next((b for p in reversed(parts) if (b := re.sub(r"^[a-z]+", "", p)) in _WIDTH), None)
    if bits is None:
        raise ValueError(f"no operand size in .global{mods}")
    return lanes * _WIDTH[bits]


def instrument(ptx: str) -> Instrumented:
    """The module with every register-addressed global access recorded; see the module doc."""
    out: list[str] = []
    sites: list[Site] = []
    unsupported: list[str] = []
    function = ""
    declared = False
    for n, line in enumerate(ptx.splitlines(), 1):
        entry = _ENTRY.match(line)
        if entry:
            function = entry.group(1)
        if line.strip() == "{" and function and not declared:
            out.append(line)
            out.append("\t.reg .b64 \t%macc<3>;")
            declared = True
            continue
        if line.strip() == "}":
            declared = False
        if line.startswith(".address_size"):
            out.append(line)
            out.append(f"\n.global .align 8 .u64 {BUFFER};")
            continue
        m = _ACCESS.match(line)
        addr = _ADDRESS.search(m.group("args")) if m else None
        if m is None:
            if ".global" in line and re.match(r"^\s*(@!?%p\d+\s+)?[a-z]", line):
                if not line.strip().startswith(("cvta", ".global", "mov")):
                    unsupported.append(f"{n}: {line.strip()}")
            out.append(line)
            continue
        if addr is None or not declared:
            unsupported.append(f"{n}: {line.strip()}")
            out.append(line)
            continue
        op = m.group("op")
        mode = READ if op == "ld" else WRITE if op == "st" else READ | WRITE
        site = Site(len(sites), function, n, mode, _width(m.group("mods")))
        sites.append(site)
        pred, ind = m.group("pred") or "", m.group("indent") or "\t"
        off = int(addr.group("off") or 0)
        base = addr.group("reg")
        first = (
            f"add.s64 \t%macc0, {base}, {off};"
            if base.startswith("%")
            else f"mov.u64 \t%macc0, {base}+{off};"  # a module global: its address
        )
        for ins in (
            first,
            f"ld.global.u64 \t%macc1, [{BUFFER}];",
            f"add.s64 \t%macc1, %macc1, {site.index * RECORD_BYTES};",
            "atom.global.min.u64 \t%macc2, [%macc1], %macc0;",
            f"add.s64 \t%macc0, %macc0, {site.width};",
            "atom.global.max.u64 \t%macc2, [%macc1+8], %macc0;",
        ):
            out.append(f"{ind}{pred}{ins}")
        out.append(line)
    return Instrumented("\n".join(out) + "\n", sites, unsupported)


def initial_records(num_sites: int) -> bytes:
    """The record buffer before a run: every site untouched (min = all ones, max = 0)."""
    return struct.pack("<QQ", *_UNTOUCHED) * num_sites


def extents(records: bytes, sites: list[Site]) -> list[tuple[Site, int, int]]:
    """(site, lo, hi) for every site some thread executed, from the buffer after a run."""
    out = []
    for site in sites:
        lo, hi = struct.unpack_from("<QQ", records, site.index * RECORD_BYTES)
        if (lo, hi) != _UNTOUCHED and hi > lo:
            out.append((site, lo, hi))
    return out
