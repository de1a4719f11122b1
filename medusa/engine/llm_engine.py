"""The engine: start-up in the stages real engines have (each timed and logged), then continuous
batching over the scheduler and the model runner."""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from medusa.engine.block_manager import BlockManager
from medusa.engine.config import EngineConfig
from medusa.engine.device import Device
from medusa.engine.loader import ModelSource, open_model
from medusa.engine.model_runner import ModelRunner
from medusa.engine.sampling import SamplingParams
from medusa.engine.scheduler import Scheduler
from medusa.engine.sequence import Sequence
from medusa.engine.tokenizer import IncrementalDecoder, Tokenizer
from medusa.trace import control as trace

log = logging.getLogger("medusa.engine.startup")

STAGES = ("runtime_init", "weights_alloc", "weights_load", "tokenizer", "kv_profile",
          "kv_alloc", "graph_capture")  # fmt: skip


@dataclass
class StepOutput:
    seq: Sequence
    token: int
    text: str  # the text this token completed (may be "" mid-character)
    finished: bool


class LLMEngine:
    def __init__(self, config: EngineConfig, *, source: ModelSource | None = None) -> None:
        self.config = config
        self.timings: dict[str, float] = {}
        self.kv_profile: dict[str, int] = {}
        t0 = time.perf_counter()
        with self._stage("runtime_init"):
            self.source = source or open_model(config.model)
            self.spec = self.source.spec
            self.device = Device()
        self.runner = ModelRunner(config, self.spec, self.device)
        with self._stage("weights_alloc"):
            self.runner.allocate_weights()
        with self._stage("weights_load"):
            self.runner.load_weights(self.source.weights())
        with self._stage("tokenizer"):
            self.tokenizer: Tokenizer = self.source.tokenizer()
        with self._stage("kv_profile"):
            self.runner.allocate_workspace()
            if config.kv_cache_memory is None:
                num_blocks, self.kv_profile = self.runner.profile_kv_blocks()
            else:
                num_blocks = config.kv_cache_memory // self.runner.block_bytes
        with self._stage("kv_alloc"):
            self.runner.allocate_kv(num_blocks)
        with self._stage("graph_capture"):
            self.runner.capture_graphs()
        trace.mark("ready")
        self.timings["total"] = time.perf_counter() - t0
        log.info("engine.startup total: %.2f s (%d KV blocks, %d graphs)", self.timings["total"],
                 num_blocks, len(self.runner.graphs))  # fmt: skip
        self.blocks = BlockManager(num_blocks, config.block_size)
        self.scheduler = Scheduler(config, self.blocks, self.tokenizer.eos_ids)
        self._rng = random.Random(config.seed)
        self._decoders: dict[int, IncrementalDecoder] = {}

    @contextmanager
    def _stage(self, name: str) -> Iterator[None]:
        trace.mark(name)
        t0 = time.perf_counter()
        yield
        self.timings[name] = dt = time.perf_counter() - t0
        log.info("engine.startup %s: %.3f s", name, dt)

    def shutdown(self) -> None:
        """Frees the engine's device memory (another engine can then start in this process)."""
        self.runner.release()

    def __enter__(self) -> LLMEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    @property
    def num_kv_blocks(self) -> int:
        return self.blocks.num_blocks

    # ---- requests ----
    @property
    def max_prompt_tokens(self) -> int:
        """The longest prompt accepted: one that is prefilled in one step and leaves room for a
        generated token."""
        return min(self.config.max_model_len, self.config.max_num_batched_tokens) - 1

    def check_prompt(self, prompt: list[int]) -> None:
        if not prompt:
            raise ValueError("the prompt is empty")
        if len(prompt) > self.max_prompt_tokens:
            raise ValueError(
                f"the prompt has {len(prompt)} tokens; this engine takes at most "
                f"{self.max_prompt_tokens} (max_model_len={self.config.max_model_len}, "
                f"max_num_batched_tokens={self.config.max_num_batched_tokens})"
            )
        bad = [t for t in prompt if not 0 <= t < self.spec.vocab_size]
        if bad:
            raise ValueError(
                f"token id {bad[0]} is outside the vocabulary (0..{self.spec.vocab_size - 1})"
            )

    def add_request(self, prompt: list[int], params: SamplingParams) -> Sequence:
        self.check_prompt(prompt)
        seed = params.seed if params.seed is not None else self._rng.getrandbits(63)
        seq = Sequence(prompt, params, seed)
        self._decoders[seq.seq_id] = IncrementalDecoder(self.tokenizer)
        self.scheduler.add(seq)
        return seq

    def abort(self, seq: Sequence) -> None:
        if seq in self.scheduler.waiting:
            self.scheduler.waiting.remove(seq)
        if seq.status.name != "FINISHED":
            self.scheduler.finish(seq, "abort")
        self._decoders.pop(seq.seq_id, None)

    def has_unfinished(self) -> bool:
        return self.scheduler.num_unfinished > 0

    def step(self) -> list[StepOutput]:
        seqs, is_prefill = self.scheduler.schedule()
        if not seqs:
            return []
        tokens = self.runner.execute(seqs, is_prefill)
        finished = {s.seq_id for s in self.scheduler.postprocess(seqs, tokens)}
        outs = []
        for seq, tok in zip(seqs, tokens, strict=True):
            dec = self._decoders.get(seq.seq_id)
            text = dec.push(tok) if dec and tok not in self.tokenizer.eos_ids else ""
            if dec and seq.params.stop and seq.seq_id not in finished:
                if any(stop in dec.sent for stop in seq.params.stop):
                    self.scheduler.finish(seq, "stop")
                    finished.add(seq.seq_id)
            done = seq.seq_id in finished
            if done:
                self._decoders.pop(seq.seq_id, None)
            outs.append(StepOutput(seq, tok, text, done))
        return outs

    def generate(
        self, prompts: list[str], params: SamplingParams, *, chat: bool = False,
        on_step: Callable[[list[StepOutput]], None] | None = None,
    ) -> list[str]:  # fmt: skip
        """Runs prompts to completion; returns each completion's text (stop strings cut off)."""
        seqs = []
        for p in prompts:
            text = (
                self.tokenizer.apply_chat_template([{"role": "user", "content": p}]) if chat else p
            )
            seqs.append(self.add_request(self.tokenizer.encode(text), params))
        while self.has_unfinished():
            outs = self.step()
            if on_step:
                on_step(outs)
        return [completion_text(self.tokenizer, s) for s in seqs]


def completion_text(tok: Tokenizer, seq: Sequence) -> str:
    ids = [t for t in seq.completion_ids if t not in tok.eos_ids]
    text = tok.decode(ids)
    for stop in seq.params.stop:
        i = text.find(stop)
        if i >= 0:
            text = text[:i]
    return text
