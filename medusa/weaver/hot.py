"""Weaver in the hot engine, a step hook of it (medusa.engine.step_hooks) that `pair` adds and
`unpair` removes: part of the decode batch's attention, with those sequences' KV, runs on a
receiver (a cold model's worker, `medusa.weaver.cold`) through an exchange region.

- Assignment is fixed after prefill: the i-th sequence whose prompt completes is offloaded when
  floor((i + 1) r) > floor(i r), `assign_offload`'s rule over the stream of prefilled sequences,
  once the receiver has opened the region (until then every sequence stays here).
- An offloaded sequence's prefill KV is sent over once (an APPEND task per layer: the K and V rows
  its local blocks hold, after RoPE), then its local blocks are freed. Sending is exact and costs
  the receiver no compute; recomputing the prefill there would need the hot model's weights.
- A decode step with offloaded sequences replays the step's graph cut after each layer's
  attention (`ModelRunner.execute_woven`, num_layers + 1 segments captured at the first such step
  of a batch size; eager past the largest graph size): each layer's attention runs here for the
  local rows (offloaded rows have no slot and length 0), then between two segments the offloaded
  rows' q/k/v go to the receiver and its output replaces theirs before the o projection. Steps
  without one replay the whole-step graphs.
- A receiver that dies, hangs (heartbeat timeout) or refuses a task: the step is dropped, the
  offloaded sequences are requeued to be prefilled again here from their tokens, offloading stops,
  and `error` names what happened. The wait is bounded by the sender's timeout: never a hang.
- `unpair` (the receiver's model gets busy or scales down) brings every offloaded sequence's KV
  back into local blocks (exact: decoding goes on as if it had never left), or requeues it when
  the local cache has no room; then the receiver stops serving the region. Nothing is lost."""

from __future__ import annotations

import logging
from collections.abc import Callable

import numpy as np

from medusa.engine.llm_engine import LLMEngine
from medusa.engine.sequence import Sequence
from medusa.engine.step_hooks import Step, StepHook
from medusa.weaver.offload import OffloadBlocks, WeavingLink, region_geometry
from medusa.weaver.region import RECEIVER_PID, ExchangeRegion
from medusa.weaver.sender import ReceiverLost, WeaverError, WeaverSender

log = logging.getLogger("medusa.weaver.hot")


def pair(engine: LLMEngine, link: WeavingLink) -> HotWeaving:
    """Between steps: offloads `link.ratio` of the sequences `engine` prefills from now on to the
    receiver that opens `link.region` (created here)."""
    paired = hot_weaving(engine)
    if paired is not None:
        raise RuntimeError(f"already paired through {paired.region.path}")
    hot = HotWeaving(link, engine)
    engine.add_hook(hot)
    return hot


def unpair(engine: LLMEngine) -> None:
    """Between steps: the offloaded sequences' KV comes back and the region is removed."""
    hot = hot_weaving(engine)
    if hot is not None:
        engine.remove_hook(hot)


def hot_weaving(engine: LLMEngine) -> HotWeaving | None:
    """The engine's pairing as the hot side, if it has one."""
    return next((h for h in engine.hooks if isinstance(h, HotWeaving)), None)


class HotWeaving(StepHook):
    decodes = True

    def __init__(self, link: WeavingLink, engine: LLMEngine) -> None:
        self.engine, self.runner, self.ratio = engine, engine.runner, link.ratio
        self.geometry = region_geometry(engine.spec, engine.config)
        self.region = ExchangeRegion.create(link.region, self.geometry, dir_fd=link.dir_fd)
        self.sender = WeaverSender(self.region, link.timeout)
        self.offloaded: set[int] = set()  # sequences whose KV and attention are the receiver's
        self._seqs: dict[int, Sequence] = {}
        self._released: list[int] = []
        self.blocks = OffloadBlocks(engine.blocks, self.offloaded, self._released)
        # How to put a sequence back in the waiting queue, to be prefilled again.
        self._requeue: Callable[[Sequence], None] = engine.scheduler.requeue
        self.num_prefilled = 0  # sequences whose prompt completed, offloaded or not
        self.num_offloaded = 0
        self.num_recomputed = 0
        self.num_taken_back = 0
        self.error: str | None = None  # why offloading stopped
        self.unpaired = False

    @property
    def active(self) -> bool:
        return self.error is None and not self.unpaired

    @property
    def receiving(self) -> bool:
        """Active, and the receiver has opened the region."""
        return self.active and self.region.counter(RECEIVER_PID) != 0

    # ---- the engine's step hooks ----
    def attach(self, engine: LLMEngine) -> None:
        engine.scheduler.blocks = self.blocks

    def detach(self) -> None:
        """Unpairs (the offloaded sequences come back), then ends the pairing."""
        self.unpair()
        self.close()
        self.engine.scheduler.blocks = self.blocks.inner

    def after_step(self, step: Step) -> None:
        """After each step: releases finished sequences on the receiver and offloads the prefilled
        ones (prompt complete, not finished) that the ratio picks."""
        self.flush()
        prefilled = [o.seq for o in step.outputs if step.is_prefill and not o.finished]
        for seq in prefilled:
            i, self.num_prefilled = self.num_prefilled, self.num_prefilled + 1
            if self.receiving and int((i + 1) * self.ratio) > int(i * self.ratio):
                self._hand_over(seq)

    def decode(self, seqs: list[Sequence]) -> list[int] | None:
        """A decode step: by graph if no sequence is offloaded, else eagerly with the offloaded
        rows' attention on the receiver. None: the receiver was lost or refused, its sequences
        are requeued, and the step must run again."""
        if not self.flush():
            return None  # NOTE: seqs may hold requeued sequences, without blocks now
        remote = [i for i, s in enumerate(seqs) if s.seq_id in self.offloaded]
        if not remote:
            return self.runner.execute(seqs, is_prefill=False)
        ids = [seqs[i].seq_id for i in remote]
        lens = [len(seqs[i]) for i in remote]
        try:
            return self.runner.execute_woven(
                seqs, set(remote), lambda layer: self._attend(layer, len(seqs), remote, ids, lens)
            )
        except (ReceiverLost, WeaverError) as e:
            self._give_up(e)
            return None

    def flush(self) -> bool:
        """Releases the finished sequences on the receiver; False if it was lost meanwhile."""
        if not self._released or not self.active:
            self._released.clear()
            return True
        ids, self._released[:] = list(self._released), []
        for sid in ids:
            self._seqs.pop(sid, None)
        try:
            self.sender.release(ids)
        except (ReceiverLost, WeaverError) as e:
            self._give_up(e)
            return False
        return True

    def unpair(self) -> None:
        """Between steps: every offloaded sequence comes back (its KV into local blocks, or, with
        no room for it, requeued to be prefilled again), then the receiver stops serving."""
        self.flush()
        for sid in sorted(self.offloaded):
            if not self.active:
                break  # the receiver was lost meanwhile: _give_up requeued the rest
            self._take_back(self._seqs[sid])
        if self.receiving:
            try:
                self.sender.stop()
            except (ReceiverLost, WeaverError) as e:
                log.warning("weaving: stopping the receiver: %s", e)
        self.unpaired = True

    def close(self) -> None:
        """Ends the pairing: frees what the receiver holds, stops it serving this region, and
        removes the region file."""
        if self.receiving:
            try:
                self.sender.release(sorted(self.sender.offloaded))
                self.sender.stop()
            except (ReceiverLost, WeaverError) as e:
                log.warning("weaving: closing the pairing: %s", e)
        self.region.close()
        self.region.unlink()
        self.runner.drop_segments()

    # ---- work ----
    def _hand_over(self, seq: Sequence) -> None:
        n = seq.num_computed
        if n > self.geometry.max_tokens:
            return
        k, v = self._read_kv(seq.block_table, n)
        try:
            for layer in range(self.geometry.num_layers):
                self.sender.append(layer, [seq.seq_id], [n], k[layer], v[layer], [0, n])
        except (ReceiverLost, WeaverError) as e:
            self._give_up(e)  # NOTE: seq is not offloaded yet: its local blocks are intact
            return
        self.blocks.inner.deallocate(seq)
        self.offloaded.add(seq.seq_id)
        self._seqs[seq.seq_id] = seq
        self.num_offloaded += 1

    def _take_back(self, seq: Sequence) -> None:
        if not self.blocks.inner.can_allocate(seq):
            self.offloaded.discard(seq.seq_id)
            self._released.append(seq.seq_id)
            self.flush()
            self._recompute(seq.seq_id)
            return
        try:
            k, v = self.sender.take_back(seq.seq_id)
        except (ReceiverLost, WeaverError) as e:
            self._give_up(e)
            return
        self.offloaded.discard(seq.seq_id)
        self._seqs.pop(seq.seq_id)
        self.blocks.inner.allocate(seq)
        self._write_kv(seq.block_table, k, v)
        self.num_taken_back += 1

    def _write_kv(self, table: list[int], k: np.ndarray, v: np.ndarray) -> None:
        """The inverse of _read_kv: rows [layers, n, kv_size] into the blocks of `table`."""
        r, g, bs = self.runner, self.geometry, self.runner.config.block_size
        if r.kv is None:
            raise RuntimeError("the KV cache is not allocated")
        n = k.shape[1]
        nb = -(-n // bs)
        rows = np.zeros((g.num_layers, 2, nb * bs, g.kv_size), np.float32)
        rows[:, 0, :n], rows[:, 1, :n] = k, v
        blocks = rows.reshape(g.num_layers, 2, nb, bs, g.kv_size).transpose(2, 0, 1, 3, 4)
        for b, data in zip(table[:nb], blocks, strict=True):
            r.dev.upload(r.kv.ptr + b * r.block_bytes, data)

    def _read_kv(self, table: list[int], n: int) -> tuple[np.ndarray, np.ndarray]:
        """A sequence's first n K and V rows of every layer, [layers, n, kv_size] each, from its
        local blocks ([block][layer][k|v][slot][kv head][dim])."""
        r, g, bs = self.runner, self.geometry, self.runner.config.block_size
        if r.kv is None:
            raise RuntimeError("the KV cache is not allocated")
        floats, base = r.block_bytes // 4, r.kv.ptr
        blocks = [r.dev.download(base + b * r.block_bytes, np.float32, floats)
                  for b in table[: -(-n // bs)]]  # fmt: skip
        kv = np.stack(blocks).reshape(len(blocks), g.num_layers, 2, bs, g.kv_size)
        rows = kv.transpose(1, 2, 0, 3, 4).reshape(g.num_layers, 2, -1, g.kv_size)[:, :, :n]
        return np.ascontiguousarray(rows[:, 0]), np.ascontiguousarray(rows[:, 1])

    def _attend(
        self, layer: int, t: int, remote: list[int], ids: list[int], lens: list[int]
    ) -> None:
        """After layer `layer`'s local attention: the offloaded rows' q/k/v (RoPE applied) go to
        the receiver, and its output takes their place in the attention output."""
        r, s = self.runner, self.runner.spec
        r.dev.synchronize()
        qkv = r.dev.download(r.ws["qkv"], np.float32, t * s.qkv_size).reshape(t, s.qkv_size)[remote]
        q, kv = s.q_size, s.q_size + s.kv_size
        out = self.sender.attend(layer, ids, lens, qkv[:, :q], qkv[:, q:kv], qkv[:, kv:])
        attn = r.dev.download(r.ws["attn"], np.float32, t * q).reshape(t, q)
        attn[remote] = out
        r.dev.upload(r.ws["attn"], attn)

    def _give_up(self, e: Exception) -> None:
        """Stops offloading; every offloaded sequence is prefilled again here."""
        lost = sorted(self.offloaded)
        if isinstance(e, WeaverError):  # the receiver lives: free what it holds of them
            try:
                self.sender.release(sorted(self.sender.offloaded))
            except (ReceiverLost, WeaverError) as again:
                log.warning("weaving: releasing on the receiver: %s", again)
        self.error = str(e)
        log.warning("weaving stopped, %d offloaded sequence(s) recomputed locally: %s",
                    len(lost), e)  # fmt: skip
        self.offloaded.clear()
        self._released.clear()
        self.sender.offloaded.clear()
        self.sender.lengths.clear()
        for sid in lost:
            self._recompute(sid)

    def _recompute(self, sid: int) -> None:
        """Sequence `sid` (no longer offloaded, no local KV) goes back to be prefilled again."""
        self._requeue(self._seqs.pop(sid))
        self.num_recomputed += 1
