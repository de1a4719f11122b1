"""VMM call costs per page on this machine's backend (simcuda here), next to kvcached's published
A100 figures per 2 MB page (benchmarks/bench_vmm) for orientation: what mapping a page of the
elastic KV cache costs on the critical path (map + set access) and off it (create, release).

Run: python scripts/bench/vmm.py [--pages 64]
"""

from __future__ import annotations

import argparse
import time

from medusa.cuda import load_backend
from medusa.prism.vmm import Vmm

KVCACHED_A100_US = {"create": 193, "map": 1.5, "set_access": 36, "unmap": 26, "release": None}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pages", type=int, default=64)
    n = ap.parse_args().pages
    b = load_backend()
    v = Vmm(b)
    page = v.granularity
    va = v.reserve(n * page)
    t: dict[str, float] = {}

    def timed(name, fn):  # type: ignore[no-untyped-def]
        t0 = time.perf_counter()
        out = [fn(i) for i in range(n)]
        t[name] = (time.perf_counter() - t0) / n * 1e6
        return out

    handles = timed("create", lambda _i: v.create(page))
    timed("map", lambda i: v.map(va + i * page, page, handles[i]))
    timed("set_access", lambda i: v.set_access(va + i * page, page))
    timed("unmap", lambda i: v.unmap(va + i * page, page))
    timed("release", lambda i: v.release(handles[i]))
    v.free_range(va, n * page)
    print(f"{b.kind} ({b.device_name()}), {n} pages of {page >> 20} MiB")
    print(f"{'call':12} {'here us/page':>13} {'kvcached A100 us':>17}")
    for k, us in t.items():
        ref = KVCACHED_A100_US[k]
        print(f"{k:12} {us:13.1f} {ref if ref is not None else '-':>17}")
    crit = t["map"] + t["set_access"]
    print(f"critical path of a new page (map + set access): {crit:.1f} us here, 37.5 on the A100")


if __name__ == "__main__":
    main()
