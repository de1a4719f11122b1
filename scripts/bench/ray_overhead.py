"""The gateway's own overhead on the cold path, local back-end and ray back-end side by side in one
run (`medusa gateway --cluster local` and `--cluster ray`, the latter starting a one-node Ray
cluster on this machine with this machine's slices as resources).

Per back-end, one slice and one model (an artifact without a weight store), cold each time:
  cold TTFT    a request for the cold model to its first streamed token (1-token prompt, 1 token)
  restore      the worker's engine start-up (its medusa_startup_seconds{stage="total"})
  warm TTFT    the same request once warm: generation alone
  overhead     cold TTFT - restore - warm TTFT: starting the process (and, with Ray, the actor and
               the artifact's fetch), its imports and HTTP server, the gateway's health polling
The first cold start on Ray also ships the artifact to the node; it is reported apart.
Target (issue 19): ray's overhead <= local's + 0.5 s on this machine.
Run: python scripts/bench/serverless.py --cluster ray [--repeats 3]   (needs the [ray] extra; or
this script itself, with the same --repeats)
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from gateway_coldstart import metric, ttft  # scripts/bench/, next to this file
from serverless import clean_env, launch_gateway

from medusa.progress import Progress

ENGINE = {
    "max_num_seqs": 4,
    "max_model_len": 256,
    "max_num_batched_tokens": 128,
    "gpu_memory_utilization": 0.4,
}


def _env() -> dict[str, str]:
    env = clean_env()
    env.pop("RAY_ADDRESS", None)  # --cluster ray starts its own one-node cluster
    # NOTE: Ray sets OMP_NUM_THREADS=1 in its actors (num_cpus=0), so the workers they start
    # have it: the same for local workers, else they compete for this machine's few cores.
    env["OMP_NUM_THREADS"] = "1"
    return env


def wait_cold(base: str, timeout: float = 120) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if {m["state"] for m in httpx.get(f"{base}/v1/models").json()["data"]} == {"cold"}:
            return
        time.sleep(0.1)
    raise RuntimeError("the model did not scale down")


def run(tmp: Path, cluster: str, art: Path, repeats: int) -> dict[str, list[float]]:
    (tmp / "slices.yaml").write_text("slices:\n  - {name: s0, memory_gb: 8}\n")
    engine = "{" + ", ".join(f"{k}: {v}" for k, v in ENGINE.items()) + "}"
    cfg = tmp / f"{cluster}.yaml"
    cfg.write_text(
        f"models:\n  a: {{artifact: {art}, keep_alive: 1, engine: {engine}}}\nslices: slices.yaml\n"
    )
    env = {**_env(), "MEDUSA_ARTIFACT_CACHE": str(tmp / "cache")}
    out: dict[str, list[float]] = {"cold": [], "restore": [], "warm": []}
    with open(tmp / f"{cluster}.log", "w") as log:
        proc, base = launch_gateway(cfg, env, log, "--cluster", cluster)
        try:
            with httpx.Client(timeout=300) as c:
                for _ in range(repeats + (cluster == "ray")):
                    wait_cold(base)
                    out["cold"].append(ttft(c, base, "a"))
                    out["restore"].append(
                        metric(
                            base,
                            "medusa_gateway_cold_start_stage_seconds",
                            model="a",
                            stage="total",
                        )
                    )
                    out["warm"].append(statistics.median(ttft(c, base, "a") for _ in range(3)))
        finally:
            proc.terminate()
            proc.wait(timeout=120)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    compare(ap.parse_args().repeats)


def compare(repeats: int) -> None:
    """Measures both back-ends' cold path and prints them side by side."""
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        art = tmp / "art"
        opts = [f"--{k.replace('_', '-')}={v}" for k, v in ENGINE.items()]
        cmd = [sys.executable, "-m", "medusa.cli", "materialize", "--no-weights", *opts]
        progress = Progress(steps=3)
        with progress.step("materializing"):
            subprocess.run([*cmd, "--out", str(art)], env=_env(), check=True, capture_output=True)
        rows = {}
        for backend in ("local", "ray"):
            with progress.step(f"{repeats} cold starts through the {backend} back-end"):
                rows[backend] = run(tmp, backend, art, repeats)
    shipped = {k: v.pop(0) for k, v in rows["ray"].items()}  # the first: artifact shipped too
    over = {
        name: [c - r - w for c, r, w in zip(row["cold"], row["restore"], row["warm"], strict=True)]
        for name, row in rows.items()
    }
    ms = lambda xs: statistics.median(xs) * 1000  # noqa: E731
    print(f"cold path, 1 slice, median of {repeats}        {'local':>9} {'ray':>9}")
    for key, label in (
        ("cold", "cold TTFT"),
        ("restore", "worker restore (engine total)"),
        ("warm", "warm TTFT (generation)"),
    ):
        print(f"  {label:38} {ms(rows['local'][key]):6.0f} ms {ms(rows['ray'][key]):6.0f} ms")
    print(
        f"  {'overhead = cold - restore - warm':38} {ms(over['local']):6.0f} ms "
        f"{ms(over['ray']):6.0f} ms"
    )
    extra = ms(over["ray"]) - ms(over["local"])
    print(f"  ray's extra overhead on the cold path: {extra:.0f} ms (target <= 500 ms)")
    first = (shipped["cold"] - shipped["restore"] - shipped["warm"]) * 1000
    print(
        f"  ray's first cold start (artifact shipped to the node and verified): overhead "
        f"{first:.0f} ms, cold TTFT {shipped['cold'] * 1000:.0f} ms"
    )


if __name__ == "__main__":
    main()
