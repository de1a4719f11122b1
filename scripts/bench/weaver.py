"""Per-operator times of the engine's kernels on the backend (simcuda here), for Weaver's
simulator: one decoder layer of SmolLM2-135M's shape (hidden 576, 9 heads / 3 KV heads of 64,
MLP 1536), each kernel launched through medusa.engine.device.Device and timed to completion,
at several batch sizes (and KV lengths for attention); a least-squares line per operator,
seconds = fixed + per_row x rows (rows: batch, or KV tokens read for attention), printed as the
OPS / ATTENTION literals that medusa/weaver/weaving_simulator.py keeps as its `simcuda` profile.

Run: MEDUSA_LIB_DIR=... python scripts/bench/weaver.py [--repeat N]
"""

from __future__ import annotations

import argparse
import os
import time

# NOTE: one BLAS thread: on a shared 2-core machine OpenBLAS's worker threads wait for cores
# other processes hold, and a 1 ms GEMM reads as 12-60 ms.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402

from medusa.engine.device import Device  # noqa: E402

H, NH, KVH, HD, FF, BLOCK = 576, 9, 3, 64, 1536, 16
Q, KV = NH * HD, KVH * HD
QKV = Q + 2 * KV


def timed(dev: Device, fn, repeat: int) -> float:  # type: ignore[no-untyped-def]
    fn()
    dev.synchronize()
    best = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        dev.synchronize()
        best.append(time.perf_counter() - t0)
    return float(np.median(best))


def layer_ops(dev: Device, b: int, bufs: dict) -> dict:  # type: ignore[type-arg]
    p = {k: v.ptr for k, v in bufs.items()}
    return {
        "rms_norm": lambda: dev.launch("rms_norm_kernel", p["h"], p["x"], p["g"], b, H, 1e-5),
        "qkv_proj": lambda: dev.linear(p["qkv"], p["h"], p["wqkv"], b, QKV, H),
        "rope": lambda: dev.launch(
            "rotary_embedding",
            p["qkv"],
            p["qkv"] + Q * 4,
            p["pos"],
            b,
            NH,
            KVH,
            HD,
            QKV,
            p["rope"],
            HD,
            1.0,
            1,
        ),  # fmt: skip
        "cache": lambda: dev.launch(
            "reshape_and_cache_kernel",
            p["kc"],
            p["vc"],
            p["qkv"] + Q * 4,
            p["qkv"] + (Q + KV) * 4,
            p["slots"],
            b,
            KVH,
            HD,
            QKV,
            BLOCK,
            BLOCK * KV,  # one layer's cache: blocks BLOCK rows apart
        ),  # fmt: skip
        "o_proj": lambda: dev.linear(p["x"], p["attn"], p["wo"], b, H, Q, accumulate=True),
        "gate_up": lambda: dev.linear(p["gu"], p["h"], p["wgu"], b, 2 * FF, H),
        "silu_mul": lambda: dev.launch("silu_and_mul_kernel", p["act"], p["gu"], b, FF),
        "down_proj": lambda: dev.linear(p["x"], p["act"], p["wd"], b, H, FF, accumulate=True),
    }


def attention(dev: Device, bufs: dict, m: dict, b: int, per_seq: int):  # type: ignore[no-untyped-def,type-arg]
    p = {k: v.ptr for k, v in bufs.items()}
    return lambda: dev.launch(
        "paged_attention_kernel", p["attn"], p["qkv"], p["kc"], p["vc"], m["bt"].ptr,
        m["lens"].ptr, m["qs"].ptr, b, NH, KVH, HD, BLOCK, per_seq, QKV, HD**-0.5, BLOCK * KV,
    )  # fmt: skip


def fit(xs: list[int], ys: list[float]) -> tuple[float, float]:
    per, fixed = np.polyfit(np.asarray(xs, float), np.asarray(ys), 1)
    return max(float(fixed), 0.0), max(float(per), 0.0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=7)
    args = ap.parse_args()
    dev = Device()
    bmax, ctx_max = 64, 1024
    blocks = bmax * ctx_max // BLOCK
    rng = np.random.default_rng(0)
    sizes = {"x": bmax * H, "h": bmax * H, "g": H, "qkv": bmax * QKV, "attn": bmax * Q,
             "gu": bmax * 2 * FF, "act": bmax * FF, "wqkv": QKV * H, "wo": H * Q,
             "wgu": 2 * FF * H, "wd": H * FF, "rope": HD // 2, "kc": blocks * BLOCK * KV,
             "vc": blocks * BLOCK * KV}  # fmt: skip
    bufs = {k: dev.alloc(4 * n) for k, n in sizes.items()}
    for k, n in sizes.items():
        dev.upload(bufs[k], rng.standard_normal(n, np.float32) * 0.05)
    for k, arr in (("pos", np.arange(bmax, dtype=np.int32)),
                   ("slots", np.arange(bmax, dtype=np.int32))):  # fmt: skip
        bufs[k] = dev.alloc(arr.nbytes)
        dev.upload(bufs[k], arr)
    batches = [1, 4, 16, 64]
    print(f"backend {dev.kind}; one SmolLM2-135M layer; median of {args.repeat}; ms")
    print(f"{'operator':12}" + "".join(f"{'b=' + str(b):>9}" for b in batches) + "    fit")
    ops: dict[str, tuple[float, float]] = {}
    for name in layer_ops(dev, 1, bufs):
        ys = [timed(dev, layer_ops(dev, b, bufs)[name], args.repeat) for b in batches]
        ops[name] = fit(batches, ys)
        print(f"{name:12}" + "".join(f"{y * 1e3:9.3f}" for y in ys)
              + f"    {ops[name][0] * 1e6:.1f} us + {ops[name][1] * 1e6:.3f} us/row")  # fmt: skip
    xs, ys = [], []
    for b, ctx in ((1, 256), (4, 256), (4, 1024), (16, 512), (64, 256)):
        per_seq = ctx // BLOCK
        bt = np.arange(b * per_seq, dtype=np.int32).reshape(b, per_seq)
        meta = {"bt": bt, "lens": np.full(b, ctx, np.int32),
                "qs": np.arange(b + 1, dtype=np.int32)}  # fmt: skip
        m = {k: dev.alloc(v.nbytes) for k, v in meta.items()}
        for k, v in meta.items():
            dev.upload(m[k], v)
        t = timed(dev, attention(dev, bufs, m, b, per_seq), args.repeat)
        xs.append(b * ctx)
        ys.append(t)
        print(f"{'attention':12} batch {b:3} x {ctx:5} KV tokens   {t * 1e3:9.3f}")
        for v in m.values():
            dev.free(v)
    att = fit(xs, ys)
    print(f"attention fit: {att[0] * 1e6:.1f} us + {att[1] * 1e9:.2f} ns per KV token read")
    print("\n# paste into medusa/weaver/weaving_simulator.py (seconds: fixed, per row)")
    print("SIMCUDA_OPS = {")
    for name, (a, b) in ops.items():
        print(f'    "{name}": OpCost({a:.3g}, {b:.3g}),')
    print("}")
    print(f"SIMCUDA_ATTENTION = OpCost({att[0]:.3g}, {att[1]:.3g})")


if __name__ == "__main__":
    main()
