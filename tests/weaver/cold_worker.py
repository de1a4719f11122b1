"""A cold model's worker for the tests: it runs its own kernels (a fixed chain of engine kernels
on its own buffers, `--steps` times), polling the exchange region after each kernel, then keeps
polling until the sender stops it, and prints the sha256 of its own output."""

from __future__ import annotations

import argparse
import hashlib

import numpy as np

from medusa.engine.device import Device
from medusa.weaver.receiver import WeaverReceiver
from medusa.weaver.region import ExchangeRegion

ROWS, DIM = 8, 64


def cold_model(dev: Device) -> tuple[list, object]:
    """The cold model: x <- x + silu(W x) * (W x) chains, its kernels as closures."""
    rng = np.random.default_rng(7)
    x, h, w = dev.alloc(ROWS * DIM * 4), dev.alloc(ROWS * 2 * DIM * 4), dev.alloc(2 * DIM * DIM * 4)
    act, g = dev.alloc(ROWS * DIM * 4), dev.alloc(DIM * 4)
    dev.upload(x, rng.standard_normal((ROWS, DIM), np.float32))
    dev.upload(w, rng.standard_normal((2 * DIM, DIM), np.float32) * 0.05)
    dev.upload(g, np.ones(DIM, np.float32))
    kernels = [
        lambda: dev.launch("rms_norm_kernel", act.ptr, x.ptr, g.ptr, ROWS, DIM, 1e-5),
        lambda: dev.linear(h.ptr, act.ptr, w.ptr, ROWS, 2 * DIM, DIM),
        lambda: dev.launch("silu_and_mul_kernel", act.ptr, h.ptr, ROWS, DIM),
        lambda: dev.launch("add_inplace_kernel", x.ptr, act.ptr, ROWS * DIM),
    ]
    return kernels, x


def digest(dev: Device, x: object) -> str:
    dev.synchronize()
    return hashlib.sha256(dev.download(x, np.float32, ROWS * DIM).tobytes()).hexdigest()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("region")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--blocks", type=int, default=64)
    ap.add_argument("--block-size", type=int, default=4)
    args = ap.parse_args()
    dev = Device()
    kernels, x = cold_model(dev)
    rec = WeaverReceiver(ExchangeRegion(args.region), dev, args.blocks, args.block_size)
    running = True
    for _ in range(args.steps):
        for k in kernels:
            k()
            running = running and rec.poll()
    if running:
        rec.serve()
    print(digest(dev, x), rec.served, flush=True)
    rec.close()


if __name__ == "__main__":
    main()
