"""Continuous batching: picks the next batch (a prefill of waiting sequences, else a decode step
of running ones) and retires finished sequences. Never touches device memory."""

from __future__ import annotations

from collections import deque

from medusa.engine.block_manager import Blocks
from medusa.engine.config import EngineConfig
from medusa.engine.sequence import Sequence, Status


class Scheduler:
    def __init__(self, config: EngineConfig, block_manager: Blocks, eos_ids: tuple[int, ...]):
        self.config = config
        self.blocks = block_manager
        self.eos_ids = set(eos_ids)
        self.waiting: deque[Sequence] = deque()
        self.prefilling: deque[Sequence] = deque()  # admitted, prompt not all in the cache yet
        self.running: deque[Sequence] = deque()

    @property
    def num_unfinished(self) -> int:
        return len(self.waiting) + len(self.running) + len(self.prefilling)

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def schedule(self) -> tuple[list[Sequence], bool]:
        """(sequences, is_prefill). Prefill first: unfinished chunked prefills, then new sequences,
        within the token budget; else one decode step of the running ones."""
        c = self.config
        cap = c.max_prefill_chunk or c.max_num_batched_tokens
        batch: list[Sequence] = []
        tokens = 0
        for seq in self.prefilling:
            seq.chunk = min(cap, len(seq) - seq.num_computed, c.max_num_batched_tokens - tokens)
            if seq.chunk <= 0:
                break
            tokens += seq.chunk
            batch.append(seq)
        active = len(self.running) + len(self.prefilling)
        while self.waiting and active < c.max_num_seqs:
            seq = self.waiting[0]
            n = min(cap, len(seq), c.max_num_batched_tokens - tokens)
            # NOTE: without chunking a sequence is prefilled whole (with the tokens it had when
            # preempted), so it waits for a step with room for all of it.
            if n <= 0 or (c.max_prefill_chunk is None and n < len(seq)):
                break
            if not self.blocks.can_allocate(seq):
                break
            self.blocks.allocate(seq)
            seq.status = Status.RUNNING
            seq.num_computed, seq.chunk = 0, n
            tokens += n
            active += 1
            batch.append(self.waiting.popleft())
            self.prefilling.append(seq)
        if batch:
            return batch, True
        scheduled: list[Sequence] = []
        while self.running:
            seq = self.running.popleft()
            while not self.blocks.can_append(seq):
                if self.running:
                    self._preempt(self.running.pop())
                else:
                    self._preempt(seq)
                    break
            else:
                self.blocks.may_append(seq)
                scheduled.append(seq)
        self.running.extend(scheduled)
        return scheduled, False

    def requeue(self, seq: Sequence) -> None:
        """Puts a running sequence back to be prefilled again from its tokens (its KV is lost)."""
        if seq in self.running:
            self.running.remove(seq)
        self._preempt(seq)

    def _preempt(self, seq: Sequence) -> None:
        seq.status = Status.WAITING
        seq.num_computed = 0
        self.blocks.deallocate(seq)
        self.waiting.appendleft(seq)

    def postprocess(
        self, seqs: list[Sequence], tokens: list[int], is_prefill: bool = False
    ) -> tuple[list[Sequence], list[Sequence]]:
        """Appends each sampled token (a prefill chunk that is not the prompt's last samples
        nothing); returns (the sequences that got a token, those that finished)."""
        done, got = [], []
        for seq, tok in zip(seqs, tokens, strict=True):
            if is_prefill:
                seq.num_computed += seq.chunk
                if seq.num_computed < len(seq):
                    continue
                self.prefilling.remove(seq)
                self.running.append(seq)
            seq.num_computed = len(seq)
            seq.token_ids.append(tok)
            got.append(seq)
            reason = None
            if tok in self.eos_ids and not seq.params.ignore_eos:
                reason = "stop"
            elif seq.num_completion_tokens >= seq.params.max_tokens:
                reason = "length"
            elif len(seq) >= self.config.max_model_len:
                reason = "length"
            if reason:
                self.finish(seq, reason)
                done.append(seq)
        return got, done

    def finish(self, seq: Sequence, reason: str) -> None:
        seq.status = Status.FINISHED
        seq.finish_reason = seq.finish_reason or reason
        self.blocks.deallocate(seq)
        for queue in (self.running, self.prefilling):
            if seq in queue:
                queue.remove(seq)
