"""Serving while the weights arrive: each part of the forward pass (the embedding, layer i, the
final norm and LM head) waits for its own weights before its kernels are launched.

The store holds the tensors in load order (embed, layer 0 .. N-1, norm), and its load publishes a
watermark (medusa.weights.loader.LoadProgress): every chunk below it passed its checksum and its
copies are queued on the load's stream. A part blocks on the host until the watermark covers its
bytes (without the GIL, so the load goes on), then records an event on the load's stream, which
runs its copies in order, and makes the compute stream wait for it: the part's kernels run after
its copies, and the host never waits for a copy. Only checked bytes are ever read: a part whose
chunks end in a bad one raises WeightsNotIn before any of its kernels is launched."""

from __future__ import annotations

import ctypes
from ctypes import c_uint, c_void_p
from typing import TYPE_CHECKING

from medusa.weights.errors import WeightStoreError
from medusa.weights.loader import EVENT_DISABLE_TIMING

if TYPE_CHECKING:
    from medusa.cuda.backend import Backend
    from medusa.engine.weight_load import WeightLoad
    from medusa.weights.format import Header


class WeightsNotIn(WeightStoreError):
    """The load ended without the bytes a part of the forward pass needs: nothing computed in
    this step may be used (the caller reloads the weights and runs the step again)."""


class LayerGate:
    def __init__(
        self, b: Backend, load: WeightLoad, header: Header, copied: set[str], num_layers: int,
        stream: int,
    ) -> None:  # fmt: skip
        """copied: the weights the load copies; stream: the one the forward pass launches on."""
        self.b, self.load, self.stream = b, load, stream
        ends: dict[str, int] = {t.name: t.end for t in header.tensors if t.name in copied}
        layer = [0] * num_layers
        rest = 0
        for name, end in ends.items():
            if name.startswith("layers."):
                i = int(name.split(".")[1])
                layer[i] = max(layer[i], end)
            else:
                rest = max(rest, end)
        # NOTE: a part waits for everything below its last byte, so the order of the tensors in
        # the store only changes how soon, never whether, its bytes are in.
        self.embed_end = ends.get("embed", 0)
        self.layer_end = layer
        self.head_end = max([rest, *layer])  # the head reads norm and embed (or lm_head)
        self.covered = 0  # bytes of the data below this are in, and the compute stream waits
        self.waiting: int | None = None  # the offset a part is blocked on, while it is
        ev = c_void_p()
        b.call("cudaEventCreateWithFlags", ctypes.byref(ev), c_uint(EVENT_DISABLE_TIMING))
        self.event = int(ev.value or 0)

    @property
    def complete(self) -> bool:
        """Every part's weights are in: the load can be finished and the gate dropped."""
        return self.covered >= self.head_end

    def embedding(self) -> None:
        self._wait(self.embed_end)

    def layer(self, i: int) -> None:
        self._wait(self.layer_end[i])

    def head(self) -> None:
        self._wait(self.head_end)

    def _wait(self, end: int) -> None:
        if end <= self.covered:
            return
        self.waiting = end
        try:
            code, bad = self.load.progress.wait(end)
        finally:
            self.waiting = None
        if code:
            why = f"chunk {bad} does not match its checksum" if code == 1 else "the load stopped"
            raise WeightsNotIn(f"the weight store's load ended before byte {end}: {why}")
        # NOTE: recorded after the watermark passed `end`: the load's stream is in order, so the
        # event follows every copy of the chunks below it.
        self.b.call("cudaEventRecord", c_void_p(self.event), c_void_p(self.load.stream))
        self.b.call("cudaStreamWaitEvent", c_void_p(self.stream), c_void_p(self.event), c_uint(0))
        self.covered = end

    def close(self) -> None:
        if self.event:
            self.b.call("cudaEventDestroy", c_void_p(self.event))
            self.event = 0
