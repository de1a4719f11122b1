"""The engine: start-up in the stages real engines have (each timed and logged: its StartUp,
medusa.engine.startup), then continuous batching over the scheduler and the model runner, with the
step hooks other systems take part through (medusa.engine.step_hooks)."""

from __future__ import annotations

import gc
import logging
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from medusa.engine.config import EngineConfig
from medusa.engine.device import Device
from medusa.engine.kv_cache import kv_cache_class
from medusa.engine.loader import ModelSource
from medusa.engine.sampling import SamplingParams
from medusa.engine.scheduler import Scheduler
from medusa.engine.sequence import Sequence, StepOutput
from medusa.engine.startup import StartUp, without_gc
from medusa.engine.step_hooks import Step, StepHook, step_hook_factory
from medusa.engine.tensor_parallel import TPRank
from medusa.engine.tokenizer import IncrementalDecoder, Tokenizer
from medusa.weights import WeightStore

if TYPE_CHECKING:
    from medusa.artifact import Artifact
    from medusa.engine.weight_load import WeightLoad

log = logging.getLogger("medusa.engine.startup")


class LLMEngine:
    @without_gc
    def __init__(
        self,
        config: EngineConfig,
        *,
        source: ModelSource | None = None,
        artifact: str | Path | Artifact | None = None,
        require_artifact: bool = False,
        validate: bool = False,
        trust: str | Path | None = None,
        device: Device | None = None,
        store: str | Path | WeightStore | None = None,
        store_checked: str = "",
        restore_since: int = 0,
        on_stage: Callable[[str], None] | None = None,
        tensor_parallel: TPRank | None = None,
    ) -> None:
        """artifact: a directory, or an Artifact loaded and checked ahead (a pooled worker's).
        device: a Device made earlier in this process (a pooled worker's, whose runtime and
        kernels are already initialized); by default a new one. store: a weight store to load
        (by default the artifact's, if it has one), or one opened ahead. store_checked: the
        descriptor number, in this process's parent (the gateway), of a sealed copy of the store
        it checked in full (MEDUSA_STORE_CHECKED, medusa.weights.sealed): if it holds this
        store's header, the weights come from it and nothing is hashed again. restore_since:
        this process's trace sequence number this engine's start-up began after (another engine
        lives on in the process: medusa.restore.Restorer's `since`). The plug-ins the config
        names (kv_memory, step_hooks) must be registered (medusa.plugins). on_stage: called
        with each start-up stage's name as it begins. tensor_parallel: this process's rank of a
        tensor-parallel group (medusa.engine.tensor_parallel); every rank is given the same
        requests in the same order."""
        kv_cache_class(config.kv_memory)  # NOTE: a plug-in not registered fails before any work
        hook_factories = [step_hook_factory(name) for name in config.step_hooks]
        self.config = config
        self.startup = StartUp(config, require=require_artifact, store_checked=store_checked,
                               restore_since=restore_since, on_stage=on_stage,
                               tensor_parallel=tensor_parallel)  # fmt: skip
        self.startup.run(source, artifact, trust, device, store, validate)
        s = self.startup
        self.device, self.source, self.spec, self.runner = s.device, s.source, s.spec, s.runner
        self.tokenizer = s.tokenizer
        self.timings = s.timings  # NOTE: the same dict: a store's load may settle while serving
        self.kv_profile, self.restorer = s.kv_profile, s.restorer
        self.kv_size = s.kv_size  # the block count and how it came about (medusa.engine.kv_size)
        self.prefill_steps = self.runner.prefill.steps  # {"graph": n, "eager": n}: the same dict
        self.restored, self.restore_error, self.restore_methods = (
            s.restored, s.restore_error, s.restore_methods)  # fmt: skip
        if self.runner.kv_cache is None:
            raise RuntimeError("the KV cache was not allocated")
        self.blocks = self.runner.kv_cache.blocks
        self.scheduler = Scheduler(config, self.blocks, self.tokenizer.eos_ids)
        self._rng = random.Random(config.seed)
        self._decoders: dict[int, IncrementalDecoder] = {}
        self.hooks: list[StepHook] = []
        for make in hook_factories:
            self.add_hook(make(self))

    # ---- what the start-up may still change while serving (a store's load settling) ----
    @property
    def store(self) -> WeightStore | None:
        return self.startup.store

    @property
    def store_error(self) -> str | None:
        """Why a weight store was not used."""
        return self.startup.store_error

    @property
    def _loading(self) -> WeightLoad | None:
        """A store's copy still running (served while loading, not settled yet)."""
        return self.startup._loading

    def shutdown(self) -> None:
        """Frees the engine's device memory (another engine can then start in this process)."""
        for hook in reversed(getattr(self, "hooks", [])):
            self.remove_hook(hook)
        self.startup.wait_for_load()  # NOTE: served while loading, and never settled
        self.runner.release()
        self.startup.close()
        gc.unfreeze()  # NOTE: what the start-up froze (without_gc) can be collected again

    def __enter__(self) -> LLMEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    @property
    def num_kv_blocks(self) -> int:
        return self.blocks.num_blocks

    # ---- step hooks (medusa.engine.step_hooks) ----
    def add_hook(self, hook: StepHook) -> None:
        """Between steps: `hook` takes part in the steps from the next one on."""
        if hook.decodes and any(h.decodes for h in self.hooks):
            raise RuntimeError(f"{type(hook).__name__}: another step hook runs the decode steps")
        hook.attach(self)
        self.hooks.append(hook)

    def remove_hook(self, hook: StepHook) -> None:
        """Between steps: detaches `hook` (nothing if it is not attached)."""
        if hook in self.hooks:
            self.hooks.remove(hook)
            hook.detach()

    @property
    def polls_when_idle(self) -> bool:
        """Whether a hook has work while the engine has no request: call poll_idle meanwhile."""
        return any(h.polls_when_idle for h in self.hooks)

    def poll_idle(self) -> None:
        for hook in list(self.hooks):
            if hook.polls_when_idle:
                hook.poll_idle()
        self._remove_finished_hooks()

    def _remove_finished_hooks(self) -> None:
        for hook in [h for h in self.hooks if h.finished]:
            self.remove_hook(hook)

    # ---- requests ----
    @property
    def max_prompt_tokens(self) -> int:
        """The longest prompt accepted: one that is prefilled in one step and leaves room for a
        generated token."""
        if self.config.max_prefill_chunk is not None:  # a long prompt is prefilled in chunks
            return self.config.max_model_len - 1
        return min(self.config.max_model_len, self.config.max_num_batched_tokens) - 1

    def check_prompt(self, prompt: list[int]) -> None:
        if not prompt:
            raise ValueError("the prompt is empty")
        if len(prompt) > self.max_prompt_tokens:
            raise ValueError(
                f"the prompt has {len(prompt)} tokens; this engine takes at most "
                f"{self.max_prompt_tokens} (max_model_len={self.config.max_model_len}, "
                f"max_num_batched_tokens={self.config.max_num_batched_tokens}): {self._longer()}"
            )
        bad = [t for t in prompt if not 0 <= t < self.spec.vocab_size]
        if bad:
            raise ValueError(
                f"token id {bad[0]} is outside the vocabulary (0..{self.spec.vocab_size - 1})"
            )

    def _longer(self) -> str:
        """How to start an engine that takes a longer prompt: chunked prefill (not a setting an
        artifact decides) up to max_model_len, beyond that a longer max_model_len."""
        c = self.config
        if c.max_prefill_chunk is None and c.max_num_batched_tokens < c.max_model_len:
            return (
                f"start it with --max-prefill-chunk {c.max_num_batched_tokens} (models.yaml: "
                f"engine: {{max_prefill_chunk: {c.max_num_batched_tokens}}}) to prefill prompts "
                f"of up to {c.max_model_len - 1} tokens in chunks"
            )
        return "start it with a larger --max-model-len (models.yaml: engine: {max_model_len: N})"

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
        if not self.has_unfinished():
            self.blocks.trim()

    def has_unfinished(self) -> bool:
        return self.scheduler.num_unfinished > 0

    def step(self) -> list[StepOutput]:
        seqs, is_prefill = self.scheduler.schedule()
        if not seqs:
            if not self.has_unfinished():
                self.blocks.trim()  # NOTE: an idle model's pages go back to the device at once
            return []
        t0 = time.perf_counter()
        decoder = next((h for h in self.hooks if h.decodes), None)
        if decoder is not None and not is_prefill:
            decoded = decoder.decode(seqs)
            if decoded is None:  # the hook requeued the step's sequences: schedule again
                return []
            tokens = decoded
        else:
            tokens = self.runner.execute(seqs, is_prefill)
        seconds = time.perf_counter() - t0
        num_tokens = sum(len(s) for s in seqs) if is_prefill else len(seqs)
        outs = self._outputs(seqs, tokens, is_prefill)
        step = Step(seqs, is_prefill, outs, num_tokens, seconds)
        for hook in list(self.hooks):
            hook.after_step(step)
        self._remove_finished_hooks()
        if self.has_unfinished():
            self.blocks.refill()
        else:
            self.blocks.trim()
        return outs

    def _outputs(
        self, seqs: list[Sequence], tokens: list[int], is_prefill: bool
    ) -> list[StepOutput]:
        """The step's tokens given to their sequences: their text, and which finished (a stop
        string included)."""
        got, finished_seqs = self.scheduler.postprocess(seqs, tokens, is_prefill)
        finished = {s.seq_id for s in finished_seqs}
        sampled = {s.seq_id for s in got}
        outs = []
        for seq, tok in zip(seqs, tokens, strict=True):
            if seq.seq_id not in sampled:
                continue  # a prefill chunk that is not the prompt's last
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
        self,
        prompts: list[str],
        params: SamplingParams,
        *,
        chat: bool = False,
        on_step: Callable[[list[StepOutput]], None] | None = None,
    ) -> list[str]:
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
