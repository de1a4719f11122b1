"""The gateway's overhead per warm request: the p50 latency of a request straight to a worker and
through the gateway (the difference is the gateway's share), for this checkout and, side by side
in the same run, other checkouts (--compare NAME=TREE: e.g. main's code, `git archive main | tar
-x -C /tmp/main`). The trees' gateways and workers all run at once and are asked in turn, round
after round, so that the load of a shared machine falls on every tree alike.

The request is one the worker refuses once it has parsed it (n=2): generation time, which varies
by far more than a millisecond on a CPU, is left out. The gateway's workers answer only it, so
"straight" is a `medusa run` of the same artifact started without a token, over TCP as a client
reaches it. The C libraries are MEDUSA_LIB_DIR's for every tree: compare trees whose C code is the
same.

Run: python scripts/bench/gateway_overhead.py [--compare main=/tmp/main] [--rounds 200]
(or python scripts/bench/serverless.py --overhead-only --compare main=/tmp/main)"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np
from serverless import ENGINE, _port, clean_env, launch_gateway  # scripts/bench/, next to this

from medusa.progress import Progress

HERE = Path(__file__).resolve().parents[2]  # this checkout
BODY = {"model": "m0", "prompt": [100, 101, 102], "max_tokens": 1, "n": 2}


def _start(tmp: Path, name: str, tree: Path, artifact: Path) -> tuple[list, str, str]:
    """TREE's gateway (one model, one slice) and a direct worker: (processes, both URLs)."""
    env = {**clean_env(), "PYTHONPATH": str(tree), "OPENBLAS_NUM_THREADS": "1"}
    cfg = tmp / f"overhead-{name}.yaml"
    (tmp / "slices-1.yaml").write_text("slices:\n  - {name: s0, memory_gb: 8}\n")
    cfg.write_text(
        f"models:\n  m0: {{artifact: {artifact}, keep_alive: 600, engine: {json.dumps(ENGINE)}}}\n"
        "slices: slices-1.yaml\n"
    )
    gateway, base = launch_gateway(cfg, env, subprocess.DEVNULL, cwd=tree)
    port = _port()
    opts = [f"--{k.replace('_', '-')}={v}" for k, v in ENGINE.items()]
    worker = subprocess.Popen(
        [sys.executable, "-m", "medusa.cli", "run", "--artifact", str(artifact), *opts]
        + ["--served-model-name", "m0", "--port", str(port)],
        env=env,
        cwd=tree,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return [gateway, worker], base, f"http://127.0.0.1:{port}"


def _ready(base: str, direct: str) -> None:
    httpx.post(f"{base}/v1/completions", json={**BODY, "n": 1}, timeout=600)  # its cold start
    for _ in range(3000):
        try:
            if httpx.get(f"{direct}/health", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"the worker at {direct} did not start")


def measure(
    tmp: Path, artifact: Path, trees: dict[str, Path], rounds: int = 40
) -> dict[str, tuple[float, float]]:
    """{tree name: (direct p50 ms, via-gateway p50 ms)}."""
    started = {name: _start(tmp, name, tree, artifact) for name, tree in trees.items()}
    try:
        for _, base, direct in started.values():
            _ready(base, direct)
        times: dict[str, tuple[list[float], list[float]]] = {n: ([], []) for n in trees}
        with httpx.Client(timeout=60) as c:
            for _ in range(rounds):
                for name, (_, base, direct) in started.items():
                    for url, into in ((direct, times[name][0]), (base, times[name][1])):
                        t = time.perf_counter()
                        assert c.post(f"{url}/v1/completions", json=BODY).status_code == 400
                        into.append(time.perf_counter() - t)
        ms = lambda xs: float(np.median(xs) * 1000)  # noqa: E731
        return {name: (ms(d), ms(v)) for name, (d, v) in times.items()}
    finally:
        for procs, _, _ in started.values():
            for p in procs:
                p.terminate()
            for p in procs:
                p.wait(timeout=60)


def report(results: dict[str, tuple[float, float]]) -> None:
    print(f"{'gateway overhead, p50':24}" + "".join(f" {n:>12}" for n in results))
    for i, what in enumerate(("direct ms", "via gateway ms")):
        print(f"{what:24}" + "".join(f" {r[i]:12.2f}" for r in results.values()))
    print(f"{'overhead ms':24}" + "".join(f" {r[1] - r[0]:12.2f}" for r in results.values()))


def trees(compare: list[str]) -> dict[str, Path]:
    out = {"this": HERE}
    for item in compare:
        name, _, path = item.partition("=")
        if not path or not (Path(path) / "medusa" / "cli.py").is_file():
            raise SystemExit(f"--compare {item}: expected NAME=TREE, a checkout of medusa")
        out[name] = Path(path).resolve()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--compare", action="append", default=[], metavar="NAME=TREE")
    ap.add_argument("--rounds", type=int, default=200)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        art = Path(tmp) / "art"
        opts = [f"--{k.replace('_', '-')}={v}" for k, v in ENGINE.items()]
        cmd = [sys.executable, "-m", "medusa.cli", "materialize", *opts, "--no-weights"]
        progress = Progress(steps=2)
        with progress.step("materializing"):
            subprocess.run([*cmd, "--out", str(art)], env=clean_env(), check=True,
                           capture_output=True)  # fmt: skip
        with progress.step(f"{a.rounds} rounds of requests, direct and through the gateway"):
            results = measure(Path(tmp), art, trees(a.compare), a.rounds)
        report(results)


if __name__ == "__main__":
    main()
