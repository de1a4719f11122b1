"""Prefill graphs (ModelRunner.prefill): one whole-step graph per token bucket
(config.prefill_sizes), replayed by prefill and chunked-prefill steps padded to the bucket.

Whole graphs, not vLLM's PIECEWISE pieces: the paged attention kernel already reads the step's
sequence layout (query starts, sequence lengths, block tables) from workspace buffers, so one
graph of `bucket` tokens and max_num_seqs sequences serves any prefill that fits it. PIECEWISE
would replay num_layers + 1 pieces and launch attention eagerly in between (31 replays and 60
eager launches a step for SmolLM2) to buy what the kernel gives for free here."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import numpy as np

from medusa.engine.batches import Batch, BatchBuilder
from medusa.engine.config import EngineConfig
from medusa.engine.device import Buffer, Device
from medusa.engine.kv_cache import KVCache
from medusa.engine.runner_weights import RunnerWeights
from medusa.engine.spec import ModelSpec
from medusa.restore.errors import RestoreError


class ModelRunner(Protocol):
    """What prefill graphs use of medusa.engine.model_runner.ModelRunner (which owns them: a
    protocol, not an import, so the two modules do not import each other)."""

    config: EngineConfig
    spec: ModelSpec
    weights: RunnerWeights
    batches: BatchBuilder
    ws: dict[str, Buffer]
    kv: Buffer | None
    kv_cache: KVCache | None
    prefill: PrefillGraphs

    @property
    def dev(self) -> Device: ...

    def run_batch(
        self,
        batch: Batch,
        kv: Buffer | None,
        out: Buffer,
        after_attention: Callable[[int], None] | None = None,
    ) -> list[int]: ...

    def capture_step(
        self, batch: Batch, tokens: int, seqs: int, out: Buffer, warm: bool
    ) -> int: ...

    def replay_step(self, exec_: int, batch: Batch, out: Buffer, count: int) -> list[int]: ...

    def last_logits(self, num_seqs: int) -> np.ndarray: ...

    def probe(self, size: int) -> tuple[np.ndarray, np.ndarray]: ...


class PrefillGraphs:
    """The runner's prefill graphs by token bucket, and their output buffers (sampled tokens,
    max_num_seqs of them)."""

    def __init__(self, runner: ModelRunner) -> None:
        self.runner = runner
        self.graphs: dict[int, int] = {}  # tokens -> graph exec
        self.out: dict[int, Buffer] = {}
        self.steps = {"graph": 0, "eager": 0}  # prefill steps by how they ran (GET /metrics)

    def bucket(self, num_tokens: int, num_seqs: int) -> int | None:
        """The smallest bucket a step of that many tokens fits, if it at most doubles them (a
        padded token costs what a real one does wherever compute, not launches, bounds a step:
        on a CPU, 1 token padded to 64 took 11x as long as run eagerly). None while weights
        still arrive (serve while loading): the eager step waits for each layer's own weights."""
        if num_seqs > self.runner.config.max_num_seqs or self.runner.weights.gate is not None:
            return None
        fits = next((b for b in sorted(self.graphs) if b >= num_tokens), None)
        return fits if fits is not None and fits <= 2 * num_tokens else None

    def count(self, bucket: int | None) -> None:
        self.steps["eager" if bucket is None else "graph"] += 1

    def capture(self, warm: bool) -> list[Buffer]:
        """Captures every bucket, largest first (after the decode graphs: their warm-up loaded
        the lazy modules; `warm`: there were none, warm up once here). Returns the output
        buffers it allocated, one before each capture (the restore finds them by that order)."""
        r, n = self.runner, self.runner.config.max_num_seqs
        owned = []
        for tokens in sorted(r.config.prefill_sizes, reverse=True):
            out = self.out[tokens] = r.dev.alloc(n * 4)
            owned.append(out)
            self.graphs[tokens] = r.capture_step(self._padding(tokens), tokens, n, out, warm)
            warm = False
        return owned

    def adopt(self, execs: list[int], outs: list[int], sizes: list[int]) -> None:
        """Takes restored prefill graphs (and their output buffers), in capture order."""
        n = self.runner.config.max_num_seqs
        for exec_, out, tokens in zip(execs, outs, sizes, strict=True):
            self.graphs[tokens] = exec_
            self.out[tokens] = Buffer(out, n * 4)

    def replay(self, batch: Batch, tokens: int) -> list[int]:
        """The prefill `batch` by its bucket's graph: the tokens its sequences sample."""
        padded = self.runner.batches.pad_prefill(batch, tokens)
        return self.runner.replay_step(
            self.graphs[tokens], padded, self.out[tokens], batch.num_seqs
        )

    def probe(self, tokens: int) -> tuple[np.ndarray, np.ndarray]:
        """A prefill of `tokens` probe tokens, eagerly (padded as the graph runs it) and by
        replay: (tokens, logits), each stacked as [eager, graph]. Every position of the probe
        sequences maps to one scratch block (never a live sequence's)."""
        r = self.runner
        if r.kv_cache is None:
            raise RuntimeError("the KV cache is not allocated yet")
        c, n = r.config, r.config.max_num_seqs
        lens = _split(tokens, c.max_model_len)
        with r.kv_cache.scratch_block() as block:
            tables = [[block] * c.max_blocks_per_seq for _ in lens]
            prompts = [((np.arange(x) * 7 + 17) % r.spec.vocab_size).tolist() for x in lens]
            batch = r.batches.prefill(prompts, tables, [(0.0, 1.0, 0)] * len(lens))
            padded = r.batches.pad_prefill(batch, tokens)
            eager = r.run_batch(padded, r.kv, r.ws["tokens"])
            eager_logits = r.last_logits(n).copy()
            graph = self.replay(batch, tokens)
        eager_tokens = eager[: len(lens)]
        return np.array([eager_tokens, graph]), np.stack([eager_logits, r.last_logits(n)])

    def _padding(self, tokens: int) -> Batch:
        """What a capture uploads: no sequence, every token padding."""
        r = self.runner
        i32, f32 = np.zeros(0, np.int32), np.zeros(0, np.float32)
        empty = Batch(i32, i32, i32, np.zeros((0, r.config.max_blocks_per_seq), np.int32), i32,
                      np.zeros(1, np.int32), i32, f32, f32, np.zeros(0, np.uint64))  # fmt: skip
        return r.batches.pad_prefill(empty, tokens)

    def destroy(self) -> None:
        for exec_ in self.graphs.values():
            self.runner.dev.destroy_exec(exec_)
        self.graphs, self.out = {}, {}


def _split(tokens: int, most: int) -> list[int]:
    """`tokens` as sequences of at most `most` tokens each."""
    return [min(most, tokens - s) for s in range(0, tokens, most)]


def validate_graphs(runner: ModelRunner, sizes: list[int], prefill: list[int]) -> None:
    """Each restored graph, decode (by batch size) and prefill (by tokens), against eager
    execution on a probe input; RestoreError names the first that differs."""
    Probe = Callable[[int], tuple[np.ndarray, np.ndarray]]
    decode: Probe = runner.probe
    probes = [("decode graph for batch", s, decode) for s in sizes]
    probes += [("prefill graph for tokens", t, runner.prefill.probe) for t in prefill]
    for what, key, probe in probes:
        tokens, logits = probe(key)
        if not (np.array_equal(tokens[0], tokens[1]) and np.array_equal(logits[0], logits[1])):
            raise RestoreError(
                f"validation: the restored {what} {key} gives other outputs than eager "
                "execution on the probe input"
            )
