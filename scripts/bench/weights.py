"""The weight stage of SmolLM2 on this machine, side by side in one run: the GGUF file as today
(parse, dequantize, upload), a safetensors checkpoint of the same weights, the weight store
(checked chunks read through the staging ring), the store's sealed copy for weights="host", the
physical limit: a plain copy of the same bytes from a warm page cache into device memory, and the
host-to-device floor: cudaMemcpy of the same bytes from pinned host memory.

Each variant runs in a fresh process (a cold start's device memory is fresh: on simcuda its first
touch costs page faults, which every variant pays alike); the median of --repeat runs is shown.
Target (issue 17): the store within 1.5x of the copy.
Run: python scripts/bench/weights.py [--repeat 3] [--model FILE.gguf|DIR] [--variants a,b]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from medusa.progress import Progress

CHILD = """
import ctypes, json, sys, threading, time
t0 = time.perf_counter()
import numpy as np
from medusa.engine.config import EngineConfig
from medusa.engine.device import Device
from medusa.engine.loader import open_model
from medusa.engine.model_runner import ModelRunner
from medusa.weights import open_store
from medusa.weights.sealed import seal_store
variant, store_path, hf_dir, model = sys.argv[1:5]
dev = Device()
imported = time.perf_counter() - t0
out = {}
spec = open_model(model or None).spec  # (the engine takes it from the store; not timed here)
t0 = time.perf_counter()
if variant in ("gguf", "safetensors"):
    src = open_model(hf_dir if variant == "safetensors" else model or None)
    out["open"] = time.perf_counter() - t0
    r = ModelRunner(EngineConfig(), src.spec, dev)
    r.weights.allocate()
    with r.weights.staging():
        r.weights.load_weights(src.weights())
elif variant in ("store", "store-host"):
    store = open_store(store_path)
    if variant == "store-host":  # a worker's own sealed copy (the gateway's: no copy, no hash)
        store = seal_store(store, check=False)
    out["open"] = time.perf_counter() - t0
    r = ModelRunner(EngineConfig(weights="device" if variant == "store" else "host"), spec, dev)
    r.weights.allocate(store)
    with r.weights.staging():
        r.weights.load_store(store)
elif variant == "copy-pinned":  # the host-to-device floor: cudaMemcpy from pinned memory
    store = open_store(store_path)
    data = store.read(0, store.header.data_size)
    host, n = ctypes.c_void_p(), len(data)
    dev.b.call("cudaHostAlloc", ctypes.byref(host), ctypes.c_size_t(n), ctypes.c_uint(0))
    ctypes.memmove(host, data.ctypes.data, n)
    buf = dev.alloc(n)
    t0 = time.perf_counter()
    dev.b.call("cudaMemcpy", ctypes.c_void_p(buf.ptr), host, ctypes.c_size_t(n), ctypes.c_int(1))
else:  # the physical limit: cudaMemcpy of the store's data, page cache warm
    import mmap
    store = open_store(store_path)
    with open(store_path, "rb") as f:  # (the bench's own file: mapped, as the page cache's bytes)
        mm = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
    data = np.frombuffer(mm, np.uint8)[store.header.data_offset :]
    int(data[:: 4096].sum())  # the file is in the page cache; this touches its pages here too
    buf = dev.alloc(len(data))
    if variant == "copy-touched":
        dev.upload(buf, data)
    n = int(variant.split("-")[1]) if variant.startswith("copy-") and variant[5:].isdigit() else 1
    parts = np.array_split(np.arange(len(data) // 4096 + 1), n)
    def put(p):
        lo, hi = int(p[0]) * 4096, min(len(data), (int(p[-1]) + 1) * 4096)
        dev.upload(buf.ptr + lo, data[lo:hi])
    t0 = time.perf_counter()
    threads = [threading.Thread(target=put, args=(p,)) for p in parts[1:]]
    for t in threads: t.start()
    put(parts[0])
    for t in threads: t.join()
out["seconds"] = time.perf_counter() - t0
out["imported"] = imported
print(json.dumps(out))
"""

VARIANTS = {
    "gguf": "GGUF load (today: parse, dequantize Q4_1, upload)",
    "safetensors": "safetensors load (F32 HF directory)",
    "store": "weight store (checked chunks, staging ring)",
    "store-host": "weight store, weights=host (own sealed copy, check)",
    "copy-1": "plain copy, 1 thread (fresh device memory)",
    "copy-2": "plain copy, 2 threads (fresh device memory)",
    "copy-touched": "plain copy into touched device memory",
    "copy-pinned": "cudaMemcpy from pinned host memory (H2D floor)",
}


def unpermute(w: np.ndarray, heads: int) -> np.ndarray:
    """GGUF stores Q/K rows of each head interleaved: back to Hugging Face's order."""
    d = w.shape[0] // heads
    return w.reshape(heads, d // 2, 2, -1).swapaxes(1, 2).reshape(w.shape)


def write_hf(out: Path, model: str | None) -> None:
    """The GGUF model's weights as an HF directory (config.json + F32 safetensors)."""
    from safetensors.numpy import save_file

    from medusa.engine.loader import open_model

    src = open_model(model)
    s, w = src.spec, dict(src.weights())
    t = {"model.embed_tokens.weight": w["embed"], "model.norm.weight": w["norm"]}
    for i in range(s.num_layers):
        p = f"model.layers.{i}."
        q, k, v = np.split(w[f"layers.{i}.qkv"], [s.q_size, s.q_size + s.kv_size])
        gate, up = np.split(w[f"layers.{i}.gate_up"], 2)
        t |= {p + "self_attn.q_proj.weight": unpermute(q, s.num_heads),
              p + "self_attn.k_proj.weight": unpermute(k, s.num_kv_heads),
              p + "self_attn.v_proj.weight": v, p + "self_attn.o_proj.weight": w[f"layers.{i}.o"],
              p + "mlp.gate_proj.weight": gate, p + "mlp.up_proj.weight": up,
              p + "mlp.down_proj.weight": w[f"layers.{i}.down"],
              p + "input_layernorm.weight": w[f"layers.{i}.attn_norm"],
              p + "post_attention_layernorm.weight": w[f"layers.{i}.ffn_norm"]}  # fmt: skip
    out.mkdir()
    save_file({k: np.ascontiguousarray(v) for k, v in t.items()}, str(out / "model.safetensors"))
    cfg = {"architectures": ["LlamaForCausalLM"], "hidden_size": s.hidden_size,
           "intermediate_size": s.intermediate_size, "num_hidden_layers": s.num_layers,
           "num_attention_heads": s.num_heads, "num_key_value_heads": s.num_kv_heads,
           "vocab_size": s.vocab_size, "rms_norm_eps": s.rms_eps, "rope_theta": s.rope.theta,
           "max_position_embeddings": s.max_position, "tie_word_embeddings": True}  # fmt: skip
    (out / "config.json").write_text(json.dumps(cfg))


def write_store(out: Path, model: str | None) -> int:
    from medusa.engine.loader import open_model
    from medusa.engine.loader.stored import model_record
    from medusa.weights import write_store as write

    src = open_model(model)
    info = write(out, list(src.spec.weight_shapes().items()), src.weights(), model_record(src))
    return int(info["data_bytes"])


def run(variant: str, store: Path, hf: Path, model: str | None) -> dict:
    res = subprocess.run([sys.executable, "-c", CHILD, variant, str(store), str(hf), model or ""],
                         capture_output=True, text=True)  # fmt: skip
    if res.returncode:
        sys.exit(f"the {variant} variant failed:\n{res.stderr[-3000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument(
        "--model", default=None, help="'smollm2' (default), a .gguf file or a directory"
    )
    ap.add_argument("--variants", default=",".join(VARIANTS),
                    help=f"comma-separated, of: {', '.join(VARIANTS)}")  # fmt: skip
    args = ap.parse_args()
    variants = [v for v in args.variants.split(",") if v]
    if not variants or set(variants) - set(VARIANTS):
        ap.error(f"--variants {args.variants}: name some of {', '.join(VARIANTS)}")
    with tempfile.TemporaryDirectory() as tmp:
        store, hf = Path(tmp) / "weights.store", Path(tmp) / "hf"
        progress = Progress()
        with progress.step("writing the weight store"):
            nbytes = write_store(store, args.model)
            store.read_bytes()  # warm page cache, as a restarted worker finds it
        if "safetensors" in variants:
            with progress.step("writing the safetensors checkpoint"):
                write_hf(hf, args.model)
                (hf / "model.safetensors").read_bytes()
        rows: dict[str, list[dict]] = {v: [] for v in variants}
        for i in range(args.repeat):  # round by round, so that every variant meets the same noise
            for v in progress.track(variants, f"round {i + 1} of {args.repeat}: each variant"):
                rows[v].append(run(v, store, hf, args.model))
    name = Path(args.model).name if args.model else "SmolLM2-135M"
    print(f"{name} weights: {nbytes / 2**20:.0f} MiB float32 on the device; "
          f"median of {args.repeat} fresh processes")  # fmt: skip
    print(f"  {'variant':52} {'seconds':>8} {'GB/s':>6} {'of which open':>14}")
    med = {}
    for v in variants:
        med[v] = statistics.median(r["seconds"] for r in rows[v])
        opened = statistics.median(r.get("open", 0.0) for r in rows[v])
        print(f"  {VARIANTS[v]:52} {med[v]:8.3f} {nbytes / med[v] / 1e9:6.2f} {opened:14.3f}")
    copies = [med[v] for v in ("copy-1", "copy-2") if v in med]
    if "store" in med and copies:
        ratio = med["store"] / min(copies)
        print(f"store / plain copy (the faster of 1 and 2 threads): {ratio:.2f}x (target <= 1.5x)")
    if {"store", "gguf", "safetensors"} <= set(med):
        print(f"store vs GGUF load: {med['gguf'] / med['store']:.1f}x faster; vs safetensors: "
              f"{med['safetensors'] / med['store']:.1f}x faster")  # fmt: skip
    if {"store", "copy-pinned"} <= set(med):
        gbs = {v: nbytes / med[v] / 1e9 for v in ("store", "copy-pinned")}
        share = gbs["store"] / gbs["copy-pinned"]
        print(f"weight store vs cudaMemcpy from pinned memory: {gbs['store']:.2f} GB/s vs "
              f"{gbs['copy-pinned']:.2f} GB/s ({share:.2f} of the floor)")  # fmt: skip


if __name__ == "__main__":
    main()
