"""The receiver: a cold model's worker that holds the KV of a hot model's offloaded sequences and
runs their attention between its own kernels, with the engine's own kernels
(reshape_and_cache_kernel to append k/v, paged_attention_kernel over its blocks).

Its KV cache uses the model runner's layout, [block][layer][k|v][slot][kv head][dim], so a layer's
K and V caches are two pointers into block 0 (blocks a block stride apart) and a block table is a
list of block ids. q, k, v, the sequence
lengths and query starts are read, and the output written, straight in the registered exchange
region, as a GPU kernel would read peer or C2C host memory."""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import numpy as np

from medusa.cuda.errors import CudaError
from medusa.engine.device import Buffer, Device
from medusa.errors import RefusedError
from medusa.weaver.kv import OffloadedKV, StaticOffloadedKV
from medusa.weaver.region import (
    APPEND,
    ATTEND,
    DONE,
    FETCH,
    HEARTBEAT,
    RECEIVER_PID,
    RELEASE,
    SENDER_PID,
    STOP,
    TASK,
    ExchangeRegion,
    Geometry,
    RegionError,
    process_alive,
)

F32 = 4
SENDER_CHECK_NS = 500_000_000  # how often a poll looks whether the sender's process is still there


class ReceiverError(RefusedError, RuntimeError):
    """A task the receiver cannot run (out of KV blocks, a sequence it does not hold, counts
    outside the region or its KV): refused, with nothing written."""


class WeaverReceiver:
    """Polls one exchange region and serves its tasks on `device` with `num_blocks` KV blocks of
    `block_size` tokens (all layers) for the offloaded sequences."""

    def __init__(
        self,
        region: ExchangeRegion,
        device: Device,
        num_blocks: int,
        block_size: int,
        kv: OffloadedKV | None = None,
    ) -> None:
        """kv: where the blocks live (medusa.weaver.kv); default, one allocation of them all.
        It is the receiver's from here: `close` gives it back."""
        g = region.geometry
        self.region, self.dev, self.block_size = region, device, block_size
        self.max_blocks = num_blocks
        self._part = block_size * g.kv_size * F32  # one layer's K (or V) rows of one block
        self._block_bytes = 2 * g.num_layers * self._part
        if self._block_bytes // F32 >= 2**31 or g.max_seqs * num_blocks >= 2**31:
            raise RegionError(
                f"{region.path}: {g.num_layers} layers of {g.kv_size} floats in blocks of "
                f"{block_size} tokens, {num_blocks} of them: more than the kernels can index"
            )
        self._dev_region = _register(region, device)
        self._ws: dict[str, Buffer] = {}
        try:  # NOTE: what fails from here gives back what was taken (the registration first)
            self.kv = kv or StaticOffloadedKV(device, num_blocks, self._block_bytes)
            # NOTE: the kernels read the checked copies of the task's counts here, never the
            # region's: the sender could change those between the check and the kernel.
            sizes = {"slots": g.max_tokens, "block_tables": g.max_seqs * num_blocks,
                     "seq_lens": g.max_seqs, "query_start": g.max_seqs + 1}  # fmt: skip
            for name, size in sizes.items():
                self._ws[name] = device.alloc(4 * size)
        except BaseException:
            for buf in self._ws.values():
                device.free(buf)
            if kv is None and hasattr(self, "kv"):
                self.kv.close()
            device.host_unregister(region.address)
            raise
        self.tables: dict[int, list[int]] = {}  # offloaded sequence -> its block ids here
        self.lengths: dict[int, int] = {}  # tokens of it held here
        self.served = 0
        self.sender_gone: str | None = None  # why polling ended without the sender's STOP
        self._sender_checked = 0
        region.set_counter(RECEIVER_PID, os.getpid())
        self.beat()

    def beat(self) -> int:
        now = time.monotonic_ns()
        self.region.set_counter(HEARTBEAT, now)
        return now

    def poll(self) -> bool:
        """One polling step (what the .cu polling kernel does after each kernel): runs the
        pending task if there is one. Returns False once the sender asked to stop, or once its
        process is gone (it can send no STOP then: `sender_gone` says so)."""
        now = self.beat()
        r = self.region
        task = r.counter(TASK)
        if task <= r.counter(DONE):
            return now - self._sender_checked < SENDER_CHECK_NS or self._sender_alive(now)
        kind, layer, num_seqs, num_tokens = r.task_head()
        try:
            _check_head(r.geometry, kind, layer, num_seqs, num_tokens)
            if kind in (ATTEND, APPEND):
                self._attend(layer, num_seqs, num_tokens, attention=kind == ATTEND)
            elif kind == RELEASE:
                self._release(r.array("seq_ids")[:num_seqs].tolist())
            elif kind == FETCH:
                self._fetch(layer, int(r.array("seq_ids")[0]))
            elif kind != STOP:
                raise ReceiverError(f"task kind {kind} is unknown to this receiver")
        except ReceiverError as e:
            r.fail(str(e))
        self.served += 1
        r.set_counter(DONE, task)
        return kind != STOP

    def _sender_alive(self, now: int) -> bool:
        self._sender_checked = now
        pid = self.region.counter(SENDER_PID)
        if pid and not process_alive(pid):
            self.sender_gone = f"the sender (pid {pid}) exited without stopping this receiver"
            return False
        return True

    def serve(self, kernels: list[Callable[[], None]] | None = None, idle: float = 20e-6) -> None:
        """The receiver's loop: each of `kernels` (its own model's work), a poll after each; with
        no kernels, polls alone. Returns when the sender sends STOP or its process is gone."""
        while True:
            for k in kernels or []:
                k()
                if not self.poll():
                    return
            if not kernels:
                if not self.poll():
                    return
                time.sleep(idle)

    def close(self) -> None:
        self.dev.synchronize()
        self.dev.host_unregister(self.region.address)
        for buf in self._ws.values():
            self.dev.free(buf)
        self.kv.close()

    # ---- tasks ----
    def _attend(self, layer: int, num_seqs: int, num_tokens: int, attention: bool = True) -> None:
        r, g, d = self.region, self.region.geometry, self.dev
        ids, lens, qs = self._task_rows(num_seqs, num_tokens)
        self._reserve(dict(zip(ids, lens, strict=True)))
        slots = []
        for sid, total, q0, q1 in zip(ids, lens, qs[:-1], qs[1:], strict=True):
            table = self.tables[sid]
            slots += [table[p // self.block_size] * self.block_size + p % self.block_size
                      for p in range(total - (q1 - q0), total)]  # fmt: skip
        bt = np.zeros((num_seqs, self.max_blocks), np.int32)
        for i, sid in enumerate(ids):
            bt[i, : len(self.tables[sid])] = self.tables[sid]
        ws = {name: buf.ptr for name, buf in self._ws.items()}
        d.upload(self._ws["slots"], np.asarray(slots, np.int32))
        d.upload(self._ws["block_tables"], bt)
        d.upload(self._ws["seq_lens"], np.asarray(lens, np.int32))
        d.upload(self._ws["query_start"], np.asarray(qs, np.int32))
        kc = self.kv.base + 2 * layer * self._part
        vc = kc + self._part
        stride = self._block_bytes // F32
        a = {name: self._dev_region + r.layout[name] for name in r.layout}
        d.launch("reshape_and_cache_kernel", kc, vc, a["k"], a["v"], ws["slots"],
                 num_tokens, g.num_kv_heads, g.head_dim, g.kv_size, self.block_size,
                 stride)  # fmt: skip
        if attention:
            d.launch("paged_attention_kernel", a["out"], a["q"], kc, vc, ws["block_tables"],
                     ws["seq_lens"], ws["query_start"], num_seqs, g.num_heads, g.num_kv_heads,
                     g.head_dim, self.block_size, self.max_blocks, g.q_size, g.head_dim**-0.5,
                     stride)  # fmt: skip
        d.synchronize()
        if layer == g.num_layers - 1:
            for sid, total in zip(ids, lens, strict=True):
                self.lengths[sid] = total

    def _task_rows(self, num_seqs: int, num_tokens: int) -> tuple[list[int], list[int], list[int]]:
        """An ATTEND or APPEND task's sequences, their lengths after it and its query starts,
        copied out of the region and checked: distinct sequences, each given at least one row,
        its rows following the tokens held here, the rows adding up to num_tokens."""
        r = self.region
        ids = r.array("seq_ids")[:num_seqs].tolist()
        lens = r.array("seq_lens")[:num_seqs].tolist()
        qs = r.array("query_start")[: num_seqs + 1].tolist()
        if len(set(ids)) != num_seqs:
            raise ReceiverError(f"task sequences {ids}: a sequence is given twice")
        if qs[0] != 0 or qs[-1] != num_tokens:
            raise ReceiverError(f"task query starts {qs}: must run from 0 to {num_tokens} rows")
        for sid, total, q0, q1 in zip(ids, lens, qs[:-1], qs[1:], strict=True):
            held = self.lengths.get(sid, 0)
            if q1 <= q0 or total - (q1 - q0) != held:
                raise ReceiverError(
                    f"sequence {sid}: {q1 - q0} rows to reach {total} tokens, {held} held here"
                )
        return ids, lens, qs

    def _reserve(self, lens: dict[int, int]) -> None:
        """Blocks for every sequence to reach its new length, all or none."""
        need = {}
        for sid, total in lens.items():
            need[sid] = -(-total // self.block_size) - len(self.tables.get(sid, []))
            if len(self.tables.get(sid, [])) + need[sid] > self.max_blocks:
                raise ReceiverError(f"sequence {sid}: {total} tokens exceed this receiver's KV")
        got = self.kv.take(sum(need.values()))
        if got is None:
            raise ReceiverError(
                f"out of KV blocks for sequences {sorted(lens)} ({sum(need.values())} more "
                f"needed, {self.kv.num_free()} free): offload fewer sequences to this receiver"
            )
        for sid, n in need.items():
            self.tables.setdefault(sid, []).extend(got[:n])
            del got[:n]

    def _release(self, ids: list[int]) -> None:
        for sid in ids:
            self.kv.give(self.tables.pop(sid, []))
            self.lengths.pop(sid, None)

    def _fetch(self, layer: int, sid: int) -> None:
        """Copies sequence `sid`'s K and V rows of `layer` into the region's k and v (handing it
        back to the sender)."""
        r, g = self.region, self.region.geometry
        if sid not in self.lengths:  # NOTE: held once a task's last layer went through
            raise ReceiverError(f"sequence {sid} is not held by this receiver")
        n = self.lengths[sid]
        if n > g.max_tokens:
            raise ReceiverError(f"sequence {sid} holds {n} tokens, the region {g.max_tokens}")
        rows = self.block_size * g.kv_size
        k, v = [], []
        for b in self.tables[sid]:  # this layer's K and V rows of each of the sequence's blocks
            kc = self.kv.base + b * self._block_bytes + 2 * layer * self._part
            k.append(self.dev.download(kc, np.float32, rows))
            v.append(self.dev.download(kc + self._part, np.float32, rows))
        r.array("k")[:n] = np.concatenate(k).reshape(-1, g.kv_size)[:n]
        r.array("v")[:n] = np.concatenate(v).reshape(-1, g.kv_size)[:n]
        r.array("seq_lens")[0] = n


def _register(region: ExchangeRegion, device: Device) -> int:
    """The region's device address (host-mapped for the receiver's kernels)."""
    try:
        return device.host_register(region.address, region.layout["end"], read_only=False)
    except CudaError as e:
        raise RegionError(
            f"{region.path}: the device cannot map this exchange region for writing ({e}); "
            "keep it on tmpfs (/dev/shm, where a gateway puts it): the driver pins its pages for "
            "writing, which Linux (6.5 on) refuses for a file on a disk filesystem"
        ) from None


def _check_head(g: Geometry, kind: int, layer: int, num_seqs: int, num_tokens: int) -> None:
    """A task's head within the region's geometry (what is read and written follows from it)."""
    if not 0 <= layer < g.num_layers:
        raise ReceiverError(f"task layer {layer}: the region has layers 0..{g.num_layers - 1}")
    least = 0 if kind in (RELEASE, STOP) else 1
    most = 1 if kind == FETCH else g.max_seqs
    if not least <= num_seqs <= most:
        raise ReceiverError(f"task of {num_seqs} sequences: expected {least}..{most}")
    if not 0 <= num_tokens <= g.max_tokens:
        raise ReceiverError(f"task of {num_tokens} rows: the region holds {g.max_tokens}")


def main() -> None:  # pragma: no cover - the receiver process of tests and scripts
    import argparse

    ap = argparse.ArgumentParser(
        prog="python -m medusa.weaver.receiver",
        description="Serve one Weaver exchange region on simcuda.",
    )
    ap.add_argument("region")
    ap.add_argument("--blocks", type=int, default=64)
    ap.add_argument("--block-size", type=int, default=4)
    args = ap.parse_args()
    region = ExchangeRegion(args.region)
    rec = WeaverReceiver(region, Device(), args.blocks, args.block_size)
    rec.serve()
    rec.close()


if __name__ == "__main__":
    main()
