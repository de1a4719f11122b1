"""Prefill graphs of SmolLM2 on simcuda, side by side in one run: the prefill graph stage
captured (a normal start) vs restored (seconds, and per 1000 nodes), beside the decode graphs';
and time to first token of a prompt of 256 tokens (then of 100, padded to the 128 bucket, then
the 256 again) on a restored start, with prefill graphs vs eager prefill (an artifact
materialized with --prefill-graph-sizes ''). Every start is a fresh process; the kinds
alternate, medians shown.
Run: python scripts/bench/prefill_graphs.py [--repeat 3] [--model FILE.gguf|DIR]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from serverless import clean_env  # scripts/bench/, next to this file

from medusa.artifact import load_artifact
from medusa.progress import Progress
from medusa.trace import recorder_env

CONFIG = {"max_num_seqs": 8, "max_num_batched_tokens": 512, "max_model_len": 1024}
PROMPTS = (256, 100, 256)  # the last: the first prompt again, the graph replayed before
CHILD = """
import json, sys, time
from medusa.engine.config import EngineConfig
from medusa.engine.llm_engine import LLMEngine
from medusa.engine.sampling import SamplingParams
cfg, art, lengths = json.loads(sys.argv[1]), sys.argv[2], json.loads(sys.argv[3])
e = LLMEngine(EngineConfig(**cfg), artifact=art or None, require_artifact=bool(art))
text = " ".join(["The quick brown fox jumps over the lazy dog."] * 100)
ids = e.tokenizer.encode(text)
ttft, tokens = [], []
for n in lengths:
    t0 = time.perf_counter()
    seq = e.add_request(ids[:n], SamplingParams(max_tokens=1))
    e.step()
    ttft.append(time.perf_counter() - t0)
    tokens.append(seq.completion_ids)
r = e.restorer
print(json.dumps({"timings": e.timings, "capture": e.runner.capture_seconds, "ttft": ttft,
                  "tokens": tokens, "graph_seconds": r.graph_seconds if r else [],
                  "prefill": sorted(e.runner.prefill.graphs)}))
"""


def child(cfg: dict, art: str, env: dict[str, str]) -> dict:
    res = subprocess.run([sys.executable, "-c", CHILD, json.dumps(cfg), art, json.dumps(PROMPTS)],
                         env=env, capture_output=True, text=True)  # fmt: skip
    if res.returncode:
        sys.exit(f"a start failed:\n{res.stderr[-3000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def materialize(cfg: dict, out: Path, env: dict[str, str]) -> None:
    opts = [f"--{k.replace('_', '-')}={v}" for k, v in cfg.items() if k != "model"]
    opts += [cfg["model"]] if cfg.get("model") else []
    subprocess.run([sys.executable, "-m", "medusa.cli", "materialize", *opts, "--out", str(out)],
                   env=env, check=True, capture_output=True)  # fmt: skip


def graph_nodes(art: Path) -> tuple[int, int]:
    """Nodes of the decode graphs and of the prefill graphs (captured after them)."""
    a = load_artifact(art)
    per = [a.plan["templates"][g["template"]]["num_nodes"] for g in a.plan["graphs"]]
    n = len(a.manifest["graphs"]["keys"])
    return sum(per[:n]), sum(per[n:])


def med(runs: list[dict], get) -> float:  # type: ignore[no-untyped-def]
    return statistics.median(get(r) for r in runs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3, help="starts of each kind; medians shown")
    ap.add_argument("--model", default=None, help="'smollm2' (default), a .gguf file or a dir")
    args = ap.parse_args()
    graphs = {**CONFIG, "model": args.model}
    eager = {**graphs, "prefill_graph_sizes": ""}
    env = clean_env()
    progress = Progress(steps=2 + 3 * args.repeat)
    with tempfile.TemporaryDirectory() as tmp:
        arts = {"graphs": Path(tmp) / "graphs", "eager": Path(tmp) / "eager"}
        for name, cfg in (("graphs", graphs), ("eager", eager)):
            with progress.step(f"materializing ({name} prefill)"):
                materialize(cfg, arts[name], env)
        renv = recorder_env(Path(tmp) / "r-%p.mtr", mode="restore", base=env)
        child_cfg = {**CONFIG, "model": args.model}
        runs: dict[str, list[dict]] = {"normal": [], "graphs": [], "eager": []}
        for i in range(args.repeat):  # alternating, so that every kind meets the same noise
            with progress.step(f"start {i + 1} of {args.repeat}, the normal way"):
                runs["normal"].append(child(child_cfg, "", env))
            for name in ("graphs", "eager"):
                sizes = () if name == "eager" else None
                with progress.step(f"start {i + 1} of {args.repeat}, restored ({name} prefill)"):
                    runs[name].append(child({**child_cfg, "prefill_graph_sizes": sizes},
                                            str(arts[name]), renv))  # fmt: skip
        decode_nodes, prefill_nodes = graph_nodes(arts["graphs"])
    report(runs, decode_nodes, prefill_nodes)


def cap_prefill(run: dict) -> float:
    return float(run["capture"]["prefill"])


def report(runs: dict[str, list[dict]], decode_nodes: int, prefill_nodes: int) -> None:
    normal, graphs, eager = runs["normal"], runs["graphs"], runs["eager"]
    n_dec = len(graphs[0]["graph_seconds"]) - len(graphs[0]["prefill"])
    print(f"{'graph stage':34} {'capture s':>10} {'restore s':>10} {'ratio':>7} "
          f"{'capture ms/1000':>16} {'restore ms/1000':>16}")  # fmt: skip
    for what, nodes, cap, res in (
        ("decode graphs", decode_nodes, lambda r: r["capture"]["decode"],
         lambda r: sum(r["graph_seconds"][:n_dec])),
        ("prefill graphs", prefill_nodes, lambda r: r["capture"]["prefill"],
         lambda r: sum(r["graph_seconds"][n_dec:])),
    ):  # fmt: skip
        c, r = med(normal, cap), med(graphs, res)
        label = f"{what} ({nodes} nodes)"
        print(f"{label:34} {c:10.4f} {r:10.4f} {c / r:6.0f}x {c * 1e6 / nodes:16.2f} "
              f"{r * 1e6 / nodes:16.2f}")  # fmt: skip
    c, r = (
        med(normal, lambda x: x["timings"]["graph_capture"]),
        med(graphs, lambda x: x["timings"]["graph_restore"]),
    )
    print(f"{'whole stage (graph_capture/restore)':34} {c:10.4f} {r:10.4f} {c / r:6.0f}x")
    total, pre = med(normal, lambda x: x["timings"]["total"]), med(normal, cap_prefill)
    print(f"normal start: {total:.3f} s in all, of which capturing the prefill graphs {pre:.4f} s "
          f"({pre / total:.1%})")  # fmt: skip
    e_restore = med(eager, lambda x: x["timings"]["graph_restore"])
    print(
        f"graph_restore with prefill graphs {r:.4f} s, without (eager-prefill artifact) "
        f"{e_restore:.4f} s"
    )
    print(f"{'time to first token, restored':34} {'prefill graphs s':>16} {'eager s':>8} "
          f"{'ratio':>7}  same token")  # fmt: skip
    buckets = graphs[0]["prefill"]
    for i, n in enumerate(PROMPTS):
        g = statistics.median(x["ttft"][i] for x in graphs)
        e = statistics.median(x["ttft"][i] for x in eager)
        same = all(x["tokens"][i] == eager[0]["tokens"][i] for x in graphs + eager)
        bucket = min(b for b in buckets if b >= n)
        again = " again" if n in PROMPTS[:i] else ""
        label = f"  {n} tokens{again} (bucket {bucket})"
        print(f"{label:34} {g:16.3f} {e:8.3f} {e / g:6.2f}x  {same}")


if __name__ == "__main__":
    main()
