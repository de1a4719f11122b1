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
(`[sym+off]`) are instrumented. So are generic accesses (no state space: a `.func` given a
pointer, inline assembly such as cuda_fp16's `atom.add.noftz.f16x2`) through a register: only
threads whose address is global memory (`isspacep.global`) record, at its global address (for
cudaMalloc'd memory the same number on sm_90). Any other global or generic access (`cp.async`,
a 32-bit register or symbol address) is returned as unsupported, so that nothing is missed
silently."""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass

from medusa.tessera.modes import READ, WRITE

BUFFER = "medusa_acc_buf"
RECORD_BYTES = 16  # per site: u64 min address, u64 max end address
_UNTOUCHED = (2**64 - 1, 0)

# One access, alone on its line or as a one-line inline-assembly block ("{ atom...; }").
_ACCESS = re.compile(
    r"^(?P<indent>\s*)(?:\{\s*)?(?P<pred>@!?%p\d+\s+)?(?P<op>ld|st|atom|red)"
    r"(?P<mods>(?:\.[\w:]+)*)\s+(?P<args>[^;]*);\s*\}?\s*$"
)
_ANY_ACCESS = re.compile(r"(?:^|[\s{;])(?:@!?%p\d+\s+)?(?:ld|st|atom|red)((?:\.[\w:]+)*)\s")
_OTHER_SPACES = ("shared", "local", "param", "const", "tex")
_ADDRESS = re.compile(r"\[(?P<reg>%rd\d+|[A-Za-z_$][\w$]*)(?:\+(?P<off>-?\d+))?\]")
_ENTRY = re.compile(r"^\s*\.(?:visible\s+|weak\s+)?(?:\.)?(?:entry|func)\s+(?:\([^)]*\)\s*)?(\w+)")
_TYPE = re.compile(r"[a-z]+(8|16|32|64|128)(?:x(\d+))?")  # u32, f16x2 (packed), b128


@dataclass(frozen=True)
class Site:
    index: int
    function: str
    line: int  # in the original PTX, 1-based
    mode: int  # READ, WRITE or both
    width: int  # bytes one thread accesses
    generic: bool = False  # a generic address: recorded only where it is global memory


@dataclass(frozen=True)
class Instrumented:
    ptx: str
    sites: list[Site]
    unsupported: list[str]  # global or generic accesses left as they were (file line: text)


def _width(mods: str) -> int:
    parts = mods.strip(".").split(".")
    lanes = next((int(p[1:]) for p in parts if re.fullmatch(r"v[248]", p)), 1)
    for p in reversed(parts):
        t = _TYPE.fullmatch(p)
        if t:
            return lanes * int(t.group(1)) // 8 * int(t.group(2) or 1)
    raise ValueError(f"no operand size in {mods}")


def _space(mods: str) -> str:
    """The access's state space: global, generic, or other (shared, local, param, const)."""
    parts = [p.split("::")[0] for p in mods.strip(".").split(".")]
    if "global" in parts:
        return "global"
    return "other" if any(p in _OTHER_SPACES for p in parts) else "generic"


def _record(site: Site, base: str, off: int, pred: str) -> list[str]:
    """The instructions that fold one access into its site's record."""
    if base.startswith("%"):
        first = f"{pred}add.s64 \t%macc0, {base}, {off};"
    else:
        first = f"{pred}mov.u64 \t%macc0, {base}+{off};"  # a module global: its address
    head = [first]
    if site.generic:  # NOTE: a thread that skips the access or reaches other memory records nothing
        head += [
            "setp.ne.u32 \t%maccp, 0, 0;",
            f"{pred}isspacep.global \t%maccp, %macc0;",
            "@%maccp cvta.to.global.u64 \t%macc0, %macc0;",
        ]
        pred = "@%maccp "
    return head + [
        f"{pred}{ins}"
        for ins in (
            f"ld.global.u64 \t%macc1, [{BUFFER}];",
            f"add.s64 \t%macc1, %macc1, {site.index * RECORD_BYTES};",
            "atom.global.min.u64 \t%macc2, [%macc1], %macc0;",
            f"add.s64 \t%macc0, %macc0, {site.width};",
            "atom.global.max.u64 \t%macc2, [%macc1+8], %macc0;",
        )
    ]


def _site(m: re.Match[str], index: int, function: str, line: int) -> tuple[Site, list[str]] | None:
    """The site of an access and its recording instructions, or None if it cannot be recorded."""
    space = _space(m.group("mods"))
    addr = _ADDRESS.search(m.group("args"))
    if addr is None or (space == "generic" and not addr.group("reg").startswith("%")):
        return None
    op = m.group("op")
    mode = READ if op == "ld" else WRITE if op == "st" else READ | WRITE
    site = Site(index, function, line, mode, _width(m.group("mods")), space == "generic")
    ind = m.group("indent") or "\t"
    code = _record(site, addr.group("reg"), int(addr.group("off") or 0), m.group("pred") or "")
    return site, [ind + c for c in code]


def _untracked(line: str) -> bool:
    """Whether the line holds a global or generic access (or another global operation)."""
    code = line.split("//")[0]
    if any(_space(a.group(1)) != "other" for a in _ANY_ACCESS.finditer(code)):
        return True
    stripped = code.strip()
    return (
        ".global" in code
        and bool(re.match(r"^(@!?%p\d+\s+)?[a-z]", stripped))
        and not (stripped.startswith(("cvta", ".global", "mov", "isspacep")))
    )


def instrument(ptx: str) -> Instrumented:
    """The module with every register-addressed global access recorded; see the module doc."""
    out: list[str] = []
    sites: list[Site] = []
    unsupported: list[str] = []
    function, depth = "", 0
    for n, line in enumerate(ptx.splitlines(), 1):
        entry = _ENTRY.match(line)
        if entry:
            function = entry.group(1)
        if depth == 0 and line.strip() == "{" and function:
            out += [line, "\t.reg .b64 \t%macc<3>;", "\t.reg .pred \t%maccp;"]
            depth = 1
            continue
        code = line.split("//")[0]
        depth += code.count("{") - code.count("}")
        if line.startswith(".address_size"):
            out += [line, f"\n.global .align 8 .u64 {BUFFER};"]
            continue
        m = _ACCESS.match(line)
        tracked = m is not None and _space(m.group("mods")) != "other"
        found = _site(m, len(sites), function, n) if m and tracked and depth > 0 else None
        if found:
            sites.append(found[0])
            out += found[1]
        elif tracked or (m is None and _untracked(line)):
            unsupported.append(f"{n}: {line.strip()}")
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
