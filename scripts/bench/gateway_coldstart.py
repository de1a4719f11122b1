"""A cold model's first token through `medusa gateway`, with a warm pool and without, side by side
in one run, for host-weight models (the gateway maps their weight stores once, shared).

Per gateway, one slice and two models (two copies of one host-weight artifact, so two stores):
  cold TTFT    a request for a cold model to its first streamed token (1-token prompt, 1 token)
  warm TTFT    the same request once the model is warm: what generation alone costs
  switch       the slice switches from model a to model b once a has scaled down: b's start,
               taken (pool) or spawned (no pool) to serving, excluding generation (the gateway's
               medusa_gateway_pooled_start_stage_seconds / cold_start_seconds)
Both models are resident first (each served once: the gateway maps and checks its store and keeps
it for host_keep_alive), as C2CServe's models are; "cold" means no worker, not weights on disk.
Targets: with the pool, cold TTFT <= 100 ms (issue 35; 300 ms in issue 17) and switch <= 50 ms
on this machine. --variant VAR=VALUE adds a warm-pool column whose gateway (and so its workers)
runs with that environment too, measured right after the default one.
Run: python scripts/bench/gateway_coldstart.py [--repeats 3] [--variant VAR=VALUE ...]
"""

from __future__ import annotations

import argparse
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from serverless import clean_env, launch_gateway  # scripts/bench/, next to this file

from medusa.progress import Progress

ENGINE = {
    "weights": "host",
    "max_num_seqs": 4,
    "max_model_len": 256,
    "max_num_batched_tokens": 128,
    "gpu_memory_utilization": 0.4,
}
BODY = {"prompt": [100], "max_tokens": 1, "temperature": 0, "stream": True}


def start_gateway(
    tmp: Path, name: str, arts: list[Path], pool: int, log, extra: dict[str, str]
) -> tuple:
    (tmp / "slices.yaml").write_text("slices:\n  - {name: s0, memory_gb: 8}\n")
    engine = "{" + ", ".join(f"{k}: {v}" for k, v in ENGINE.items()) + "}"
    models = "".join(
        f"  {m}: {{artifact: {a}, keep_alive: 1, host_keep_alive: 600, engine: {engine}}}\n"
        for m, a in zip("ab", arts, strict=True)
    )
    cfg = tmp / f"{name}.yaml"
    cfg.write_text(f"models:\n{models}warm_pool: {pool}\nslices: slices.yaml\n")
    return launch_gateway(cfg, {**clean_env(), **extra}, log)


def settle(base: str, pool: int, timeout: float = 120) -> None:
    """Every model cold and the pool warm."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        states = {m["state"] for m in httpx.get(f"{base}/v1/models").json()["data"]}
        idle = sum(w["state"] == "idle" for w in httpx.get(f"{base}/admin/pool").json())
        if states == {"cold"} and idle >= pool:
            return
        time.sleep(0.1)
    raise RuntimeError("the gateway did not settle (models cold, pool warm)")


def ttft(client: httpx.Client, base: str, model: str) -> float:
    t0 = time.perf_counter()
    first = None
    with client.stream("POST", f"{base}/v1/completions", json={"model": model, **BODY}) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if line.startswith("data: {") and first is None:
                first = time.perf_counter() - t0
    if first is None:
        raise RuntimeError(f"{model}: no token")
    return first


def metric(base: str, name: str, **labels: str) -> float:
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    pat = re.compile(rf"^{name}\{{(.*)\}} (\S+)$")
    for line in httpx.get(f"{base}/metrics").text.splitlines():
        m = pat.match(line)
        if m and ",".join(sorted(m.group(1).split(","))) == want:
            return float(m.group(2))
    return 0.0


def start_seconds(base: str, model: str, pool: int) -> float:
    """The gateway's sum of `model`'s start seconds, taken (or spawned) to serving."""
    if pool:
        return metric(
            base, "medusa_gateway_pooled_start_stage_seconds_sum", model=model, stage="ready"
        )
    return metric(base, "medusa_gateway_cold_start_seconds_sum", model=model)


def run(
    tmp: Path, name: str, arts: list[Path], pool: int, repeats: int, extra: dict[str, str]
) -> dict[str, list]:
    out: dict[str, list] = {"cold": [], "warm": [], "switch": [], "stages": []}
    with open(tmp / f"{name}.log", "w") as log:
        proc, base = start_gateway(tmp, name, arts, pool, log, extra)
        try:
            with httpx.Client(timeout=300) as c:
                for m in "ba":  # both resident: each served once, its store mapped by the gateway
                    settle(base, pool)
                    ttft(c, base, m)
                for _ in range(repeats):
                    settle(base, pool)
                    out["cold"].append(ttft(c, base, "a"))
                    out["warm"].append(statistics.median(ttft(c, base, "a") for _ in range(3)))
                    settle(base, pool)  # a scaled down: its slice goes to b
                    before = start_seconds(base, "b", pool)
                    ttft(c, base, "b")
                    out["switch"].append(start_seconds(base, "b", pool) - before)
                    stages = {}
                    for line in httpx.get(f"{base}/metrics").text.splitlines():
                        m = re.match(
                            r'medusa_gateway_cold_start_stage_seconds\{model="b",stage="(\w+)"\} '
                            r"(\S+)",
                            line,
                        )
                        if m:
                            stages[m.group(1)] = float(m.group(2))
                    out["stages"].append(stages)
                out["host_bytes"] = [
                    metric(base, "medusa_gateway_host_weight_bytes", model=m) for m in "ab"
                ]
        finally:
            proc.terminate()
            proc.wait(timeout=120)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--keep", default=None, help="keep the artifacts and logs in this directory")
    ap.add_argument("--variant", action="append", default=[], metavar="VAR=VALUE",
                    help="a warm-pool column with this environment too (repeatable)")  # fmt: skip
    a = ap.parse_args()
    bad = [v for v in a.variant if "=" not in v or not v.split("=", 1)[0]]
    if bad:
        ap.error(f"--variant {bad[0]!r}: give VAR=VALUE, e.g. MEDUSA_SIM_THREADS=1")
    tmp_ctx = tempfile.TemporaryDirectory()
    tmp = Path(a.keep or tmp_ctx.name)
    tmp.mkdir(parents=True, exist_ok=True)
    art = tmp / "a"
    progress = Progress()
    if not art.is_dir():
        opts = [f"--{k.replace('_', '-')}={v}" for k, v in ENGINE.items()]
        with progress.step("materializing"):
            subprocess.run(
                [sys.executable, "-m", "medusa.cli", "materialize", *opts, "--out", str(art)],
                env=clean_env(),
                check=True,
                capture_output=True,
            )
    if not (tmp / "b").is_dir():
        shutil.copytree(art, tmp / "b")  # a second store: two models resident side by side
    arts = [art, tmp / "b"]
    runs = [("no pool", "nopool", 0, {}), ("warm pool", "pool", 1, {})]
    runs += [(v, f"pool{i}", 1, dict([v.split("=", 1)])) for i, v in enumerate(a.variant)]
    rows = {}
    for name, label, pool, extra in runs:
        with progress.step(f"{a.repeats} rounds of cold, warm and switched requests: {name}"):
            rows[name] = run(tmp, label, arts, pool, a.repeats, extra)
    report(rows, a.repeats)


def report(rows: dict[str, dict[str, list]], repeats: int) -> None:
    ms = lambda xs: statistics.median(xs) * 1000  # noqa: E731
    names = list(rows)
    width = max(10, *(len(n) for n in names))
    head = " ".join(f"{n:>{width}}" for n in names)
    print(f"host-weight model, 1 slice, median of {repeats}    {head}")
    for key, label in (
        ("cold", "cold model: request to first token"),
        ("warm", "warm model: request to first token"),
        ("switch", "slice switch a -> b, excl. generation"),
    ):
        cells = " ".join(f"{ms(rows[n][key]):>{width - 3}.0f} ms" for n in names)
        print(f"  {label:40} {cells}")
    spread = ", ".join(f"{x * 1000:.0f}" for x in sorted(rows["warm pool"]["cold"]))
    print(f"  warm pool, cold model, every round (ms): {spread}")
    print("  targets with the pool: cold <= 100 ms, switch <= 50 ms")
    hb = rows["warm pool"]["host_bytes"]
    print(f"  host weight bytes mapped by the gateway: a {hb[0]:.0f}, b {hb[1]:.0f}")
    for name, row in rows.items():
        stages = ", ".join(f"{k} {v:.3f}" for k, v in row["stages"][-1].items())
        print(f"  {name}: b's engine start-up stages (s): {stages}")


if __name__ == "__main__":
    main()
