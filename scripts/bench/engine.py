"""The reference engine on simcuda with SmolLM2-135M: seconds per start-up stage, decode tokens/s
at batch 1 and 8 (graph replay vs eager, side by side), and peak RSS.

Target (issue 4): at least 10 tokens/s at batch 1 on 2 cores.
Run: python scripts/bench/engine.py [--tokens N]
"""

from __future__ import annotations

import argparse
import resource
import time

from medusa.engine.config import EngineConfig
from medusa.engine.llm_engine import LLMEngine
from medusa.engine.sampling import SamplingParams
from medusa.progress import Progress


def decode_rate(engine: LLMEngine, batch: int, tokens: int) -> float:
    prompts = [f"Write a short story about robot number {i}." for i in range(batch)]
    params = SamplingParams(max_tokens=tokens, ignore_eos=True)
    seqs = [engine.add_request(engine.tokenizer.encode(p), params) for p in prompts]
    engine.step()  # the prefill of all of them
    t0 = time.perf_counter()
    while engine.has_unfinished():
        engine.step()
    dt = time.perf_counter() - t0
    return sum(s.num_completion_tokens - 1 for s in seqs) / dt


def switch_rows(cfg: dict, tokens: int) -> None:
    """Model switch on a slice: shut one engine down, start the next; device-resident weights vs
    host-resident ones (--weights host: nothing is loaded into device memory)."""
    from medusa.cuda import load_backend

    b = load_backend()
    print("model switch          start s   device MiB for the model   decode tok/s (batch 1)")
    for weights in ("device", "host"):
        free0, _ = b.mem_get_info()
        t0 = time.perf_counter()
        with LLMEngine(EngineConfig(**{**cfg, "kv_cache_memory": 64 << 20}, weights=weights)) as e:
            start = time.perf_counter() - t0
            used = (free0 - b.mem_get_info()[0]) / 2**20 - 64
            rate = decode_rate(e, 1, tokens // 4)
        print(f"  weights {weights:6}      {start:7.2f}   {used:24.0f}   {rate:12.1f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=48, help="tokens generated per sequence")
    args = ap.parse_args()
    cfg = dict(max_num_seqs=8, max_num_batched_tokens=512, max_model_len=1024)
    rates = {}
    with Progress() as progress:
        for eager in (False, True):
            way = "eager" if eager else "with decode graphs"
            with progress.step(f"starting the engine {way}"):
                e = LLMEngine(EngineConfig(**cfg, enforce_eager=eager))  # type: ignore[arg-type]
            with e:
                if not eager:
                    print("start-up stage        seconds")
                    for stage, secs in e.timings.items():
                        print(f"  {stage:18} {secs:8.3f}")
                for batch in (1, 8):
                    with progress.step(f"decoding {args.tokens} tokens at batch {batch}, {way}"):
                        rates[(eager, batch)] = decode_rate(e, batch, args.tokens)
    print("decode tokens/s       graphs     eager   ratio")
    for batch in (1, 8):
        g, x = rates[(False, batch)], rates[(True, batch)]
        print(f"  batch {batch:<13} {g:8.1f}  {x:8.1f}  {g / x:6.2f}")
    print(f"target: >= 10 tokens/s at batch 1: {'met' if rates[(False, 1)] >= 10 else 'MISSED'}")
    switch_rows(cfg, args.tokens)
    print(f"peak RSS: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")


if __name__ == "__main__":
    main()
