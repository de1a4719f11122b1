"""One vLLM start-up in this process, for materialize (recorded) and for the cold-start benchmark.

    python -m medusa.integrations.vllm.startup --out RESULT.json [--bench] [--resolve] \
        -- MODEL [vLLM args]

Builds vllm.LLM with exactly the engine arguments given (vLLM's own parser reads them), with the
engine core in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0). With --resolve it first pins the
settings whose defaults differ between vllm.LLM and `vllm serve` (SERVE_DEFAULTS) to what `vllm
serve` resolves them to on this machine, so that this start-up is configured as a restore (which
runs `vllm serve`) will be. Writes the arguments used, the start-up seconds and the phases'
seconds; with --bench also greedy token ids and the time per output token at batch 1 and 16.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from typing import Any

PROMPTS = [
    "The capital of France is",
    "Write a haiku about the sea.",
    "List three prime numbers:",
    "Explain what a GPU does in one sentence.",
]


def engine_kwargs(argv: list[str]) -> dict[str, Any]:
    """The EngineArgs fields argv sets (other than defaults), parsed by vLLM's own parser."""
    from vllm.engine.arg_utils import EngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    def parse(args: list[str]) -> dict[str, Any]:
        parser = EngineArgs.add_cli_args(FlexibleArgumentParser())
        return vars(parser.parse_args(args))

    if not argv or argv[0].startswith("-"):
        raise SystemExit("usage: startup --out F -- MODEL [vLLM engine args]")
    model, rest = argv[0], argv[1:]
    given, default = parse(["--model", model, *rest]), parse(["--model", model])
    return _diff(given, default) | {"model": model}


# EngineArgs fields whose defaults vLLM picks by entry point (EngineArgs.get_batch_defaults, by
# UsageContext): on a GPU of 70 GiB or more that is not an A100, max_num_batched_tokens is 16384
# for vllm.LLM and 8192 for `vllm serve`. Both are in the artifact's config fingerprint.
SERVE_DEFAULTS = {
    "max_num_batched_tokens": "--max-num-batched-tokens",
    "max_num_seqs": "--max-num-seqs",
}


def serve_defaults(argv: list[str]) -> list[str]:
    """argv with every SERVE_DEFAULTS field it leaves to vLLM set to the value `vllm serve`
    resolves it to here (vLLM's own config builder, under `vllm serve`'s usage context)."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.usage.usage_lib import UsageContext
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    left = [k for k in SERVE_DEFAULTS if k not in engine_kwargs(argv)]
    if not left:
        return list(argv)
    parser = AsyncEngineArgs.add_cli_args(FlexibleArgumentParser())
    args = AsyncEngineArgs.from_cli_args(parser.parse_args(["--model", argv[0], *argv[1:]]))
    config = args.create_engine_config(usage_context=UsageContext.OPENAI_API_SERVER)
    pinned = [(SERVE_DEFAULTS[k], str(getattr(config.scheduler_config, k))) for k in left]
    return [*argv, *(x for pair in pinned for x in pair)]


def _fields(obj: Any) -> dict[str, Any]:
    return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj) if f.init}


def _diff(given: dict[str, Any], default: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for k, v in given.items():
        d = default.get(k)
        if dataclasses.is_dataclass(v) and type(v) is type(d):  # a config: only what differs
            v, d = _fields(v), _fields(d)
        if isinstance(v, dict) and isinstance(d, dict):
            if sub := _diff(v, d):
                out[k] = sub
        elif v != d:
            out[k] = v
    return out


def _tpot(llm: Any, batch: int, n: int = 64) -> tuple[float, list[list[int]]]:
    from vllm import SamplingParams

    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(batch)]
    one = SamplingParams(temperature=0.0, max_tokens=1)
    full = SamplingParams(temperature=0.0, max_tokens=n, min_tokens=n, ignore_eos=True)
    llm.generate(prompts, one, use_tqdm=False)  # warm
    t0 = time.perf_counter()
    llm.generate(prompts, one, use_tqdm=False)
    t1 = time.perf_counter()
    outs = llm.generate(prompts, full, use_tqdm=False)
    t2 = time.perf_counter()
    tpot = ((t2 - t1) - (t1 - t0)) / (n - 1)
    return tpot, [list(o.outputs[0].token_ids) for o in outs]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    split = argv.index("--") if "--" in argv else len(argv)
    ap = argparse.ArgumentParser(prog="python -m medusa.integrations.vllm.startup")
    ap.add_argument("--out", required=True)
    ap.add_argument("--bench", action="store_true")
    ap.add_argument("--resolve", action="store_true", help="pin `vllm serve`'s defaults first")
    opts = ap.parse_args(argv[:split])
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    vargs = argv[split + 1 :]
    if opts.resolve:
        vargs = serve_defaults(vargs)
    kwargs = engine_kwargs(vargs)
    from vllm import LLM

    from medusa.integrations.vllm import phases

    t0 = time.perf_counter()
    llm = LLM(**kwargs)
    result: dict[str, Any] = {
        "argv": vargs,
        "engine_args": kwargs,
        "startup_seconds": time.perf_counter() - t0,
        "phase_seconds": dict(phases.TIMINGS),
    }
    if opts.bench:
        for batch in (1, 16):
            tpot, tokens = _tpot(llm, batch)
            result[f"tpot_batch{batch}"] = tpot
            result[f"tokens_batch{batch}"] = tokens
    with open(opts.out, "w") as f:
        json.dump(result, f, default=str)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
