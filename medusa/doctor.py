"""`medusa doctor`: what Medusa will run on, and proof that it works."""

from __future__ import annotations

import struct

import click

from medusa import __version__, env
from medusa.cuda import CudaError, load_backend, paths

_ATTR_SMS, _ATTR_CC_MAJOR, _ATTR_CC_MINOR = 16, 75, 76


def _smoke_kernel(backend_kind: str) -> str:
    """Adds two vectors on the device and checks the sum on the host."""
    b = load_backend(backend_kind)
    if b.kind != "sim":
        return "skipped (the smoke kernel is a simcuda CPU kernel)"
    b.load_kernels("simcuda_testkernels")
    n = 1000
    xs = struct.pack(f"{n}f", *range(n))
    a, c = b.malloc(4 * n), b.malloc(4 * n)
    try:
        b.memcpy_htod(a, xs)
        b.launch("vector_add", 4, 256, [c, a, a, n])
        out = struct.unpack(f"{n}f", b.memcpy_dtoh(c, 4 * n))
    finally:
        b.free(a)
        b.free(c)
    return "ok" if all(out[i] == 2 * i for i in range(n)) else "WRONG RESULTS"


def run_doctor(device: str | None) -> int:
    kind = device or env.DEVICE.get()
    click.echo(f"medusa {__version__}")
    try:
        b = load_backend(kind)
        drv, rt = b.versions()
        free, total = b.mem_get_info()
        click.echo(f"back-end        {b.kind} (MEDUSA_DEVICE={kind})")
        for lib in b.libraries:
            click.echo(f"library         {lib}")
        if b.kind == "sim":
            info = paths.build_info()
            click.echo(
                f"CUDA headers    {info['cuda_headers_version']} "
                f"({info['cuda_headers_source']}: {info['cuda_include_dir']})"
            )
        click.echo(f"versions        driver {drv}, runtime {rt}")
        click.echo(f"device          {b.device_name()}")
        click.echo(f"  memory        {total / 2**30:.1f} GiB total, {free / 2**30:.1f} GiB free")
        click.echo(f"  SMs           {b.device_attribute(_ATTR_SMS)}")
        click.echo(
            f"  compute cap.  {b.device_attribute(_ATTR_CC_MAJOR)}."
            f"{b.device_attribute(_ATTR_CC_MINOR)}"
        )
        arena = b.arena()
        if arena:
            click.echo(
                f"  arena         base {arena[0]:#x}, {arena[1] / 2**30:.0f} GiB of address space"
            )
        click.echo(f"smoke kernel    {_smoke_kernel(b.kind)}")
    except (CudaError, FileNotFoundError, ValueError, RuntimeError) as e:
        click.echo(f"error: {e}", err=True)
        return 1
    return 0
