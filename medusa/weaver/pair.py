"""A hot engine and a cold engine paired by Weaver, end to end on this machine:

    python -m medusa.weaver.pair --ratio 0.5 --check "What is 2 + 2?" "Name a colour."

starts a cold engine in another process (its own model, `--cold-model`, serving its own prompt
while it polls the region), runs the prompts greedily on the hot engine with that share of its
sequences offloaded, and prints the completions, how many sequences were offloaded and the
decode speed; `--check` runs them again without offload and says whether the tokens are the
same. `--serve REGION` is the cold process's side."""

from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from medusa.engine.config import EngineConfig
from medusa.engine.llm_engine import LLMEngine
from medusa.engine.sampling import SamplingParams
from medusa.progress import Progress
from medusa.weaver.hot import pair
from medusa.weaver.offload import WeavingLink
from medusa.weaver.region import RECEIVER_PID

COLD_PROMPT = "Write a sentence about the sea."


def engine_config(model: str | None) -> EngineConfig:
    return EngineConfig(model=model, max_num_seqs=8, max_model_len=512,
                        max_num_batched_tokens=512, kv_cache_memory=64 << 20)  # fmt: skip


def serve(region: str, model: str | None, blocks: int) -> None:
    """The cold side: its own request runs while it serves the region, until the hot one stops."""
    from medusa.weaver.cold import ColdWeaving

    engine = LLMEngine(engine_config(model))
    weaving = ColdWeaving(engine, region, blocks)
    seq = engine.add_request(chat_ids(engine, COLD_PROMPT), SamplingParams(max_tokens=32))
    weaving.run()
    while engine.has_unfinished():
        engine.step()
    text = engine.tokenizer.decode(seq.completion_ids)
    print(f"cold: served {weaving.receiver.served} tasks; its own answer: {text!r}", flush=True)
    weaving.close()
    engine.shutdown()


def chat_ids(engine: LLMEngine, prompt: str) -> list[int]:
    tok = engine.tokenizer
    return tok.encode(tok.apply_chat_template([{"role": "user", "content": prompt}]))


def generate(
    engine: LLMEngine, prompts: list[str], max_tokens: int
) -> tuple[list[list[int]], float]:
    params = SamplingParams(max_tokens=max_tokens)
    seqs = [engine.add_request(chat_ids(engine, p), params) for p in prompts]
    t0 = time.perf_counter()
    while engine.has_unfinished():
        engine.step()
    return [s.completion_ids for s in seqs], time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m medusa.weaver.pair", description=__doc__.split("\n\n")[0]
    )
    ap.add_argument("prompts", nargs="*", default=["What is the capital of France?"])
    ap.add_argument("--model", help="the hot model (default: SmolLM2-135M-Instruct)")
    ap.add_argument("--cold-model", help="the cold model (default: the hot one)")
    ap.add_argument("--ratio", type=float, default=0.45, help="share of sequences offloaded")
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--blocks", type=int, default=256, help="the receiver's KV blocks")
    ap.add_argument("--check", action="store_true", help="compare with no offload")
    ap.add_argument(
        "--timeout",
        type=float,
        default=10.0,
        help="seconds without the receiver's heartbeat before it counts as lost (default 10: the "
        "cold engine polls between its own kernels, which simcuda on a busy CPU can stretch)",
    )
    ap.add_argument("--serve", metavar="REGION", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if not (math.isfinite(args.timeout) and args.timeout > 0):
        ap.error(f"--timeout {args.timeout}: give positive seconds")
    if args.serve:
        serve(args.serve, args.cold_model, args.blocks)
        return 0
    with Progress(steps=4 if args.check else 3) as progress:
        return _run(args, progress)


def _run(args: argparse.Namespace, progress: Progress) -> int:
    region = Path(tempfile.mkdtemp(prefix="weaver-", dir="/dev/shm")) / "region"
    with progress.step("starting the hot engine"):
        hot = LLMEngine(engine_config(args.model))
    w = pair(hot, WeavingLink(region, args.ratio, timeout=args.timeout))
    cmd = [sys.executable, "-m", "medusa.weaver.pair", "--serve", str(region)]
    cmd += ["--blocks", str(args.blocks)]
    cmd += ["--cold-model", args.cold_model] if args.cold_model else []
    cold = subprocess.Popen(cmd)
    try:
        with progress.step("starting the cold engine in another process"):
            while w.region.counter(RECEIVER_PID) == 0:
                if cold.poll() is not None:
                    print("the cold engine exited before serving", file=sys.stderr)
                    return 1
                time.sleep(0.05)
        with progress.step(f"generating, {args.ratio} of the sequences offloaded"):
            tokens, secs = generate(hot, args.prompts, args.max_tokens)
        for p, t in zip(args.prompts, tokens, strict=True):
            print(f"hot: {p!r} -> {hot.tokenizer.decode(t)!r}")
        n, lost = sum(map(len, tokens)), w.error or "no"
        print(f"hot: {w.num_offloaded} of {w.num_prefilled} sequences offloaded (ratio "
              f"{args.ratio}), {n} tokens in {secs:.2f} s; receiver lost: {lost}")  # fmt: skip
        hot.shutdown()
        if not _ended(cold, lost=w.error is not None):
            return 1
    finally:
        cold.kill()
        region.unlink(missing_ok=True)
        os.rmdir(region.parent)
    if args.check:
        with progress.step("generating again on a plain engine, nothing offloaded"):
            with LLMEngine(engine_config(args.model)) as plain:
                want, _ = generate(plain, args.prompts, args.max_tokens)
        print(f"identical to no offload: {'yes' if want == tokens else 'NO'}")
        return 0 if want == tokens else 1
    return 0


def _ended(cold: subprocess.Popen[bytes], lost: bool) -> bool:
    """Waits for the cold engine to finish its own request. One the hot side gave up on is told to
    stop (it was sent no STOP, and may be alive but starved); one that does not end is killed,
    and that is a failure, never a hang."""
    if lost:
        cold.terminate()
    try:
        cold.wait(timeout=120)
        return True
    except subprocess.TimeoutExpired:
        cold.kill()
        print("the cold engine did not end within 120 s of the hot one: killed", file=sys.stderr)
        return False


if __name__ == "__main__":
    sys.exit(main())
