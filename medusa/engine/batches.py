"""A step's inputs on the host (Batch) and how the model runner builds them: a prefill of token
runs (padded to a prefill graph's token bucket), a decode batch padded to a graph's size, a
padding batch; uploaded into the workspace."""

from __future__ import annotations

from collections.abc import Container, Iterable
from dataclasses import dataclass

import numpy as np

from medusa.engine.config import EngineConfig
from medusa.engine.device import Buffer, Device
from medusa.engine.sequence import Sequence


@dataclass
class Batch:
    """A step's inputs, host side. Rows of per-sequence arrays beyond num_seqs are padding."""

    ids: np.ndarray  # int32 [tokens]
    positions: np.ndarray  # int32 [tokens]
    slots: np.ndarray  # int32 [tokens], -1: padding
    block_tables: np.ndarray  # int32 [seqs, max_blocks]
    seq_lens: np.ndarray  # int32 [seqs]
    query_start: np.ndarray  # int32 [seqs + 1]
    last_rows: np.ndarray  # int32 [seqs]
    temperature: np.ndarray  # float32 [seqs]
    top_p: np.ndarray  # float32 [seqs]
    seeds: np.ndarray  # uint64 [seqs]

    @property
    def num_tokens(self) -> int:
        return len(self.ids)

    @property
    def num_seqs(self) -> int:
        return len(self.seq_lens)


class BatchBuilder:
    """The model runner's step inputs (ModelRunner.batches), built on the host."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config

    def sampling(self, seqs: list[Sequence]) -> list[tuple[float, float, int]]:
        return [
            (
                s.params.temperature,
                s.params.top_p,
                (s.seed * 0x9E3779B97F4A7C15 + s.num_completion_tokens) & (2**64 - 1),
            )
            for s in seqs
        ]

    def _meta(
        self, n: int, tables: list[list[int]], sampling: list[tuple[float, float, int]]
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        bt = np.zeros((n, self.config.max_blocks_per_seq), np.int32)
        for i, t in enumerate(tables):
            bt[i, : len(t)] = t
        temp = np.zeros(n, np.float32)
        top_p = np.ones(n, np.float32)
        seeds = np.zeros(n, np.uint64)
        for i, (tp, pp, sd) in enumerate(sampling):
            temp[i], top_p[i], seeds[i] = tp, pp, sd
        return bt, temp, top_p, seeds

    def _slots(self, table: list[int], positions: Iterable[int]) -> list[int]:
        bs = self.config.block_size
        return [table[p // bs] * bs + p % bs for p in positions]

    def prefill(
        self,
        prompts: list[list[int]],
        tables: list[list[int]],
        sampling: list[tuple[float, float, int]],
        starts: list[int] | None = None,
    ) -> Batch:
        """A prefill of token runs; run i sits at positions starts[i] .. starts[i] + len - 1 (a
        chunk of a longer prompt whose earlier tokens are in the cache already)."""
        lens = [len(p) for p in prompts]
        starts = starts or [0] * len(prompts)
        qs = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
        slots = [
            x
            for n, t, s0 in zip(lens, tables, starts, strict=True)
            for x in self._slots(t, range(s0, s0 + n))
        ]
        bt, temp, top_p, seeds = self._meta(len(prompts), tables, sampling)
        return Batch(
            ids=np.concatenate([np.asarray(p, np.int32) for p in prompts]),
            positions=np.concatenate(
                [np.arange(s0, s0 + n, dtype=np.int32) for n, s0 in zip(lens, starts, strict=True)]
            ),
            slots=np.asarray(slots, np.int32),
            block_tables=bt,
            seq_lens=np.asarray([s0 + n for n, s0 in zip(lens, starts, strict=True)], np.int32),
            query_start=qs,
            last_rows=qs[1:] - 1,
            temperature=temp,
            top_p=top_p,
            seeds=seeds,
        )

    def decode(
        self, seqs: list[Sequence], size: int, remote: Container[int] = frozenset()
    ) -> Batch:
        """A decode step of `seqs` padded to `size` rows; rows `remote` attend elsewhere (no
        slot, no local attention: Weaver)."""
        n = len(seqs)
        bt, temp, top_p, seeds = self._meta(
            size, [[] if i in remote else s.block_table for i, s in enumerate(seqs)],
            self.sampling(seqs),
        )  # fmt: skip
        pos = [len(s) - 1 for s in seqs] + [0] * (size - n)
        lens = [0 if i in remote else len(s) for i, s in enumerate(seqs)] + [0] * (size - n)
        slots = [-1 if i in remote else self._slots(s.block_table, [len(s) - 1])[0]
                 for i, s in enumerate(seqs)] + [-1] * (size - n)  # fmt: skip
        return Batch(
            ids=np.asarray([s.last_token for s in seqs] + [0] * (size - n), np.int32),
            positions=np.asarray(pos, np.int32),
            slots=np.asarray(slots, np.int32),
            block_tables=bt,
            seq_lens=np.asarray(lens, np.int32),
            query_start=np.arange(size + 1, dtype=np.int32),
            last_rows=np.arange(size, dtype=np.int32),
            temperature=temp,
            top_p=top_p,
            seeds=seeds,
        )

    def pad_prefill(self, b: Batch, tokens: int) -> Batch:
        """Prefill `b` as a prefill graph of `tokens` tokens runs it: max_num_seqs rows, padding
        tokens cached nowhere (slot -1). Padding sequences own no token, but the last one owns
        the padding tokens: their attention rows are then zeros (a query before its sequence's
        start). With no padding sequence (a full batch) the padding rows are attended by none
        and keep whatever the buffer held; every operation is row-wise and nothing reads them
        (the sampler reads the real sequences' last rows). Padding rows sample greedily from
        row 0."""
        n, t, rows = b.num_seqs, b.num_tokens, self.config.max_num_seqs
        extra_t, extra_n = tokens - t, rows - n
        qs = np.full(rows + 1, t, np.int32)
        qs[: n + 1] = b.query_start
        if extra_n:
            qs[-1] = tokens
        bt = np.zeros((rows, self.config.max_blocks_per_seq), np.int32)
        bt[:n] = b.block_tables
        return Batch(
            ids=np.concatenate([b.ids, np.zeros(extra_t, np.int32)]),
            positions=np.concatenate([b.positions, np.zeros(extra_t, np.int32)]),
            slots=np.concatenate([b.slots, np.full(extra_t, -1, np.int32)]),
            block_tables=bt,
            seq_lens=np.concatenate([b.seq_lens, np.zeros(extra_n, np.int32)]),
            query_start=qs,
            last_rows=np.concatenate([b.last_rows, np.zeros(extra_n, np.int32)]),
            temperature=np.concatenate([b.temperature, np.zeros(extra_n, np.float32)]),
            top_p=np.concatenate([b.top_p, np.ones(extra_n, np.float32)]),
            seeds=np.concatenate([b.seeds, np.zeros(extra_n, np.uint64)]),
        )

    def padding(self, size: int) -> Batch:
        return Batch(
            ids=np.zeros(size, np.int32),
            positions=np.zeros(size, np.int32),
            slots=np.full(size, -1, np.int32),
            block_tables=np.zeros((size, self.config.max_blocks_per_seq), np.int32),
            seq_lens=np.zeros(size, np.int32),
            query_start=np.arange(size + 1, dtype=np.int32),
            last_rows=np.arange(size, dtype=np.int32),
            temperature=np.zeros(size, np.float32),
            top_p=np.ones(size, np.float32),
            seeds=np.zeros(size, np.uint64),
        )


UPLOADED = ("ids", "positions", "slots", "block_tables", "seq_lens", "query_start", "last_rows",
            "temperature", "top_p", "seeds")  # fmt: skip


def upload(dev: Device, ws: dict[str, Buffer], b: Batch) -> None:
    """The batch's arrays into the workspace buffers of the same names."""
    for name in UPLOADED:
        dev.upload(ws[name], getattr(b, name))
