"""Replays a bursty multi-model request trace against `medusa gateway`, side by side: workers that
start the normal way (baseline), workers that restore Medusa artifacts without a weight store
(they load the model file), and workers that restore artifacts with a weight store taken from a
warm pool (`warm_pool: 1`). Reports cold-start TTFT separately from warm TTFT with `vllm bench
serve`'s field names. Also measures the gateway's overhead per warm request against calling a
worker directly.

Traces: --trace poisson | gamma (bursts; --cv sets burstiness) | a CSV in the Azure LLM trace
format (TIMESTAMP,ContextTokens,GeneratedTokens). Lengths of synthetic requests follow a
ShareGPT-like log-normal distribution.
Targets (issue 6): p99 TTFT >= 2x lower with Medusa; gateway overhead <= 1 ms p50 (issue 30;
--compare NAME=TREE measures another checkout's beside this one's). Issue 17: the store and the
pool lower it further.
Run: python scripts/bench/serverless.py [--duration 60] [--rate 0.5] [--models 3]
With --cluster ray (issue 19; needs the [ray] extra): instead of the trace, the gateway's own
overhead on the cold path (cold TTFT minus the worker's restore and its generation) with
`medusa gateway --cluster ray` beside `--cluster local`, median of --repeats cold starts each
(scripts/bench/ray_overhead.py); target <= 0.5 s extra.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np

from medusa.c2c.link_simulator import azure_rows
from medusa.progress import Progress


def clean_env() -> dict[str, str]:
    """This environment without MEDUSA_* settings, but where the C libraries come from."""
    keep = ("MEDUSA_LIB_DIR",)
    return {k: v for k, v in os.environ.items() if not k.startswith("MEDUSA_") or k in keep}


ENGINE = {
    "max_num_seqs": 256,
    "max_model_len": 512,
    "max_num_batched_tokens": 256,
    "gpu_memory_utilization": 0.3,
}


@dataclass
class Req:
    t: float
    model: str
    prompt_len: int
    output_len: int
    cold: bool = False


def synthetic(
    kind: str, rate: float, duration: float, models: int, cv: float, seed: int
) -> list[Req]:
    rng = random.Random(seed)
    reqs, t = [], 0.0
    while True:
        if kind == "poisson":
            t += rng.expovariate(rate)
        else:  # gamma inter-arrivals with coefficient of variation cv: bursts and idle tails
            shape = 1 / (cv * cv)
            t += rng.gammavariate(shape, 1 / (rate * shape))
        if t > duration:
            return reqs
        prompt = int(min(96, max(4, rng.lognormvariate(3.0, 0.6))))
        out = int(min(32, max(2, rng.lognormvariate(2.5, 0.5))))
        reqs.append(Req(t, f"m{rng.randrange(models)}", prompt, out))


def azure(path: str, models: int, duration: float) -> list[Req]:
    rows = azure_rows(path, duration)
    return [Req(t, f"m{i % models}", min(200, p), min(64, g)) for i, (t, p, g) in enumerate(rows)]


def mark_cold(reqs: list[Req], keep_alive: float) -> None:
    last: dict[str, float] = {}
    for r in reqs:
        r.cold = r.model not in last or r.t - last[r.model] > keep_alive
        last[r.model] = r.t


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_gateway(
    tmp: Path, name: str, artifact: Path | None, models: int, keep_alive: float, pool: int = 0
):
    cfg = tmp / f"{name}.yaml"
    art = f"artifact: {artifact}, " if artifact else ""
    lines = ["models:"] + [
        f"  m{i}: {{{art}keep_alive: {keep_alive}, max_queue: 64, engine: {json.dumps(ENGINE)}}}"
        for i in range(models)
    ]
    (tmp / "slices.yaml").write_text(
        "slices:\n" + "".join(f"  - {{name: s{i}, memory_gb: 8}}\n" for i in range(models))
    )
    cfg.write_text("\n".join(lines) + f"\nwarm_pool: {pool}\nslices: slices.yaml\n")
    env = clean_env()
    env["OPENBLAS_NUM_THREADS"] = "1"  # several workers share few cores: no oversubscription
    return launch_gateway(cfg, env, subprocess.DEVNULL)


def launch_gateway(
    cfg: Path, env: dict[str, str], log, *args: str, cwd: Path | None = None
) -> tuple:  # type: ignore[no-untyped-def]
    """`medusa gateway --config CFG ARGS` on a free port, output to `log`; (process, base URL)
    once it answers /health. cwd: the checkout whose medusa it runs (`-m` imports from there)."""
    port = _port()
    cmd = ["gateway", "--config", str(cfg), "--port", str(port), *args]
    proc = subprocess.Popen(
        [sys.executable, "-m", "medusa.cli", *cmd],
        env=env,
        cwd=cwd,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    for _ in range(300):
        try:
            if httpx.get(f"{base}/health", timeout=1).status_code == 200:
                return proc, base
        except httpx.TransportError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"the gateway did not start ({getattr(log, 'name', 'no log kept')})")


async def one(client: httpx.AsyncClient, base: str, r: Req, t0: float) -> dict:
    await asyncio.sleep(max(0.0, t0 + r.t - time.perf_counter()))
    body = {
        "model": r.model,
        "prompt": [100 + (i % 1000) for i in range(r.prompt_len)],
        "max_tokens": r.output_len,
        "temperature": 0,
        "stream": True,
    }
    start = time.perf_counter()
    first, chunks = None, 0
    try:
        async with client.stream("POST", f"{base}/v1/completions", json=body) as resp:
            if resp.status_code != 200:
                return {"ok": False, "cold": r.cold}
            async for line in resp.aiter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    chunks += 1
                    first = first or time.perf_counter()
    except httpx.HTTPError:
        return {"ok": False, "cold": r.cold}
    end = time.perf_counter()
    if first is None:
        return {"ok": False, "cold": r.cold}
    return {
        "ok": True,
        "cold": r.cold,
        "ttft": first - start,
        "out": chunks,
        "tpot": (end - first) / max(chunks - 1, 1),
        "latency": end - start,
    }


async def replay(base: str, reqs: list[Req]) -> tuple[list[dict], float]:
    async with httpx.AsyncClient(timeout=600) as client:
        t0 = time.perf_counter()
        results = await asyncio.gather(*(one(client, base, r, t0) for r in reqs))
        return list(results), time.perf_counter() - t0


def report(results: list[dict], wall: float, slo_ttft: float) -> dict[str, float]:
    ok = [r for r in results if r["ok"]]
    ms = lambda xs, q: float(np.percentile(xs, q) * 1000) if xs else float("nan")  # noqa: E731
    ttft = [r["ttft"] for r in ok]
    cold = [r["ttft"] for r in ok if r["cold"]]
    warm = [r["ttft"] for r in ok if not r["cold"]]
    tpot = [r["tpot"] for r in ok]
    return {
        "completed": len(ok),
        "failed": len(results) - len(ok),
        "request_throughput": len(ok) / wall,
        "output_throughput": sum(r["out"] for r in ok) / wall,
        "mean_ttft_ms": float(np.mean(ttft) * 1000) if ttft else float("nan"),
        "median_ttft_ms": ms(ttft, 50),
        "p99_ttft_ms": ms(ttft, 99),
        "cold_median_ttft_ms": ms(cold, 50),
        "cold_p99_ttft_ms": ms(cold, 99),
        "warm_median_ttft_ms": ms(warm, 50),
        "warm_p99_ttft_ms": ms(warm, 99),
        "median_tpot_ms": ms(tpot, 50),
        "p99_tpot_ms": ms(tpot, 99),
        "request_goodput": sum(1 for r in ok if r["ttft"] <= slo_ttft) / wall,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", default="gamma", help="poisson, gamma, or an Azure-format CSV")
    ap.add_argument("--rate", type=float, default=0.25, help="requests per second (synthetic)")
    ap.add_argument("--cv", type=float, default=3.0, help="burstiness of the gamma trace")
    ap.add_argument("--duration", type=float, default=60.0, help="seconds of trace to replay")
    ap.add_argument("--models", type=int, default=3, help="models (one slice each)")
    ap.add_argument("--keep-alive", type=float, default=8.0, help="seconds idle before scale-down")
    ap.add_argument("--slo-ttft", type=float, default=3.0, help="TTFT SLO for goodput, seconds")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--cluster",
        choices=["local", "ray"],
        default="local",
        help="ray: the cold path's overhead on a one-node Ray cluster beside local, no trace",
    )
    ap.add_argument("--repeats", type=int, default=3, help="cold starts per back-end (--cluster)")
    ap.add_argument(
        "--overhead-only", action="store_true", help="only the gateway's overhead, no trace"
    )
    ap.add_argument(
        "--compare",
        action="append",
        default=[],
        metavar="NAME=TREE",
        help="also measure the gateway overhead of the checkout TREE (e.g. main's code), "
        "side by side (scripts/bench/gateway_overhead.py)",
    )
    a = ap.parse_args()
    if a.cluster == "ray":
        from ray_overhead import compare  # scripts/bench/, next to this file

        compare(a.repeats)
        return
    import gateway_overhead  # scripts/bench/, next to this file

    trees = gateway_overhead.trees(a.compare)
    if a.overhead_only:
        with tempfile.TemporaryDirectory() as tmp:
            art = Path(tmp) / "art"
            opts = [f"--{k.replace('_', '-')}={v}" for k, v in ENGINE.items()]
            cmd = [sys.executable, "-m", "medusa.cli", "materialize", *opts, "--no-weights"]
            subprocess.run([*cmd, "--out", str(art)], env=clean_env(), check=True,
                           capture_output=True)  # fmt: skip
            gateway_overhead.report(gateway_overhead.measure(Path(tmp), art, trees, 200))
        return
    reqs = (
        azure(a.trace, a.models, a.duration)
        if a.trace.endswith(".csv")
        else synthetic(a.trace, a.rate, a.duration, a.models, a.cv, a.seed)
    )
    mark_cold(reqs, a.keep_alive)
    print(
        f"trace: {len(reqs)} requests over {a.duration:.0f} s to {a.models} models "
        f"({sum(r.cold for r in reqs)} predicted cold)"
    )
    with tempfile.TemporaryDirectory() as tmp:
        tmp_p = Path(tmp)
        art, stored = tmp_p / "art", tmp_p / "stored"
        opts = [f"--{k.replace('_', '-')}={v}" for k, v in ENGINE.items()]
        env = clean_env()
        progress = Progress(steps=6)
        for out, extra in ((art, ["--no-weights"]), (stored, [])):
            cmd = [sys.executable, "-m", "medusa.cli", "materialize", *opts, *extra]
            with progress.step(f"materializing {out.name}"):
                subprocess.run([*cmd, "--out", str(out)], env=env, check=True,
                               capture_output=True)  # fmt: skip
        rows = {}
        for name, artifact, pool in (
            ("baseline", None, 0),
            ("medusa", art, 0),
            ("store+pool", stored, 1),
        ):
            with progress.step(f"replaying the trace through a gateway: {name}"):
                proc, base = start_gateway(tmp_p, name, artifact, a.models, a.keep_alive, pool)
                try:
                    results, wall = asyncio.run(replay(base, reqs))
                finally:
                    proc.terminate()
                    proc.wait(timeout=120)
            rows[name] = report(results, wall, a.slo_ttft)
        with progress.step("measuring the gateway's own overhead"):
            overheads = gateway_overhead.measure(tmp_p, art, trees)
    print(f"{'metric':24}" + "".join(f" {name:>12}" for name in rows))
    for k in rows["baseline"]:
        print(f"{k:24}" + "".join(f" {row[k]:12.2f}" for row in rows.values()))
    for name in ("medusa", "store+pool"):
        ratio = rows["baseline"]["p99_ttft_ms"] / rows[name]["p99_ttft_ms"]
        print(f"p99 TTFT: {ratio:.2f}x lower with {name} than the baseline (target >= 2x)")
    gateway_overhead.report(overheads)
    print("target: gateway overhead <= 1 ms p50")


if __name__ == "__main__":
    main()
