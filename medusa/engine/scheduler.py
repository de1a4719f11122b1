"""Continuous batching: picks the next batch (a prefill of waiting sequences, else a decode step
of running ones) and retires finished sequences. Never touches device memory."""

from __future__ import annotations

from collections import deque

from medusa.engine.block_manager import BlockManager
from medusa.engine.config import EngineConfig
from medusa.engine.sequence import Sequence, Status


class Scheduler:
    def __init__(self, config: EngineConfig, block_manager: BlockManager, eos_ids: tuple[int, ...]):
        self.config = config
        self.blocks = block_manager
        self.eos_ids = set(eos_ids)
        self.waiting: deque[Sequence] = deque()
        self.running: deque[Sequence] = deque()

    @property
    def num_unfinished(self) -> int:
        return len(self.waiting) + len(self.running)

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def schedule(self) -> tuple[list[Sequence], bool]:
        """(sequences, is_prefill)."""
        batch: list[Sequence] = []
        tokens = 0
        while self.waiting and len(self.running) + len(batch) < self.config.max_num_seqs:
            seq = self.waiting[0]
            # NOTE: a sequence is prefilled whole, with the tokens it had when preempted.
            if tokens + len(seq) > self.config.max_num_batched_tokens:
                break
            if not self.blocks.can_allocate(seq):
                break
            self.blocks.allocate(seq)
            seq.status = Status.RUNNING
            tokens += len(seq)
            batch.append(self.waiting.popleft())
        if batch:
            self.running.extend(batch)
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

    def _preempt(self, seq: Sequence) -> None:
        seq.status = Status.WAITING
        self.blocks.deallocate(seq)
        self.waiting.appendleft(seq)

    def postprocess(self, seqs: list[Sequence], tokens: list[int]) -> list[Sequence]:
        """Appends each sampled token; returns the sequences that finished."""
        done = []
        for seq, tok in zip(seqs, tokens, strict=True):
            seq.token_ids.append(tok)
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
        return done

    def finish(self, seq: Sequence, reason: str) -> None:
        seq.status = Status.FINISHED
        seq.finish_reason = seq.finish_reason or reason
        self.blocks.deallocate(seq)
        if seq in self.running:
            self.running.remove(seq)
