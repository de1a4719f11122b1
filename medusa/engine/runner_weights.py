"""The model runner's weights: allocated on the device or in a registered store mapping, loaded
from the model file or a weight store (in the background, and, serving while loading, gated
layer by layer: medusa.engine.layer_gate)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager

import numpy as np

from medusa.engine.config import EngineConfig
from medusa.engine.device import Buffer, Device
from medusa.engine.layer_gate import LayerGate, WeightsNotIn
from medusa.engine.spec import ModelSpec
from medusa.engine.weight_load import WeightLoad
from medusa.weights import WeightStore
from medusa.weights.loader import StagingRing

F32 = 4


class RunnerWeights:
    """The model runner's weights (ModelRunner.weights), on its device; `dev` changes with the
    runner's (ModelRunner.dev)."""

    def __init__(self, config: EngineConfig, spec: ModelSpec, device: Device) -> None:
        self.config, self.spec, self.dev = config, spec, device
        self.buffers: dict[str, Buffer] = {}  # weight name -> its memory
        self.rope_table: Buffer | None = None  # float32 [rot_dim / 2]: RoPE's frequencies
        # Per-layer HybridGEMM split (the alpha controller may change them between steps).
        self.alphas: list[float] = []
        self._mapped: set[str] = set()  # weights that point into a registered store mapping
        self._registered: int | None = None  # the store mapping's host address, registered
        self._ring: StagingRing | None = None
        self.gate: LayerGate | None = None  # while a store's weights arrive (serve while loading)
        self._settle: Callable[[], None] | None = None
        self.unusable: str | None = None  # why the weights may not be read (a failed settle)
        self.shapes: dict[str, tuple[int, ...]] | None = None  # a tensor-parallel rank's own

    def allocate(self, store: WeightStore | None = None) -> None:
        """On the device, or (weights="host") the projections and the embedding in host-mapped
        memory, read over C2C by HybridGEMM; norms stay on the device either way. With a store
        and weights="host", the 2-D weights are the store's own pages: its whole (shared,
        read-only) mapping is registered once and each weight points at its aligned offset: a
        sealed copy (medusa.weights.sealed), whose bytes nobody can change after the check."""
        host = self.config.weights == "host"
        offsets: dict[str, int] = {}  # 2-D weight -> its device address in the registered store
        if store is not None and host:
            if not store.sealed:
                raise ValueError(f"{store.path}: weights='host' maps a sealed copy of a store")
            base = self.dev.host_register(store.address, store.nbytes, read_only=True)
            store.prefault()  # NOTE: the first step's pages, mapped while the start goes on
            self._registered = store.address
            data = base + store.header.data_offset
            offsets = {t.name: data + t.offset for t in store.header.tensors if len(t.shape) == 2}
        for name, shape in (self.shapes or self.spec.weight_shapes()).items():
            nbytes = int(np.prod(shape)) * F32
            if name in offsets:
                self.buffers[name] = Buffer(offsets[name], nbytes)
                self._mapped.add(name)
            elif host and len(shape) == 2:
                self.buffers[name] = self.dev.host_alloc(nbytes)
            else:
                self.buffers[name] = self.dev.alloc(nbytes)
        self.rope_table = self.dev.alloc(self.spec.rope.rot_dim // 2 * F32)
        self.alphas[:] = [self.config.alpha] * (self.spec.num_layers + 1)  # NOTE: in place

    @contextmanager
    def staging(self) -> Iterator[None]:
        """The pinned slots weight uploads pass through, for the weights_load stage."""
        try:
            with StagingRing(self.dev.b, self.dev.stream) as self._ring:
                yield
        finally:
            self._ring = None

    def load_store(self, store: WeightStore) -> None:
        """Copies the device-resident weights from the store, every chunk checked (the mapped
        ones too) unless the store is a copy the gateway checked in full (vouched);
        WeightStoreError names a bad chunk, and the weights are then not usable."""
        if self._ring is None:
            raise RuntimeError("load_store runs inside staging()")
        self._ring.load_store(store, self._copied())
        self._upload_rope()

    def start_store_load(self, store: WeightStore) -> WeightLoad:
        """load_store in the background (medusa.engine.weight_load): call finish_store_load
        with what this returns before anything reads a weight."""
        return WeightLoad(self.dev.b, store, self._copied())

    def gate_weights(
        self, load: WeightLoad, store: WeightStore, settle: Callable[[], None]
    ) -> LayerGate:
        """Runs steps while `load` goes on, each part of the forward pass waiting for its own
        weights (medusa.engine.layer_gate). settle() finishes the load once all are in, or
        replaces its weights when it failed; it runs before any graph replay or capture."""
        self._upload_rope()
        self.gate = LayerGate(self.dev.b, load, store.header, set(self._copied()),
                              self.spec.num_layers, self.dev.stream)  # fmt: skip
        self._settle = settle
        return self.gate

    def settle(self) -> None:
        """Every weight in (or the model file's, if the store's load failed): no more gating.
        If settling fails (--require-artifact, an unreadable model file), the weights are part
        copied: every later forward pass or replay raises instead of reading them."""
        gate, settle, self.gate, self._settle = self.gate, self._settle, None, None
        if gate is not None and settle is not None:
            gate.close()
            try:
                settle()
            except BaseException as e:
                self.unusable = f"the weights are not all in ({type(e).__name__}: {e})"
                raise

    def check_usable(self) -> None:
        if self.unusable is not None:
            raise RuntimeError(f"{self.unusable}; start the engine again")

    def gated(self, run: Callable[[], None]) -> None:
        try:
            run()
        except WeightsNotIn:
            # NOTE: what ran of this step read only checked chunks, but the store is given up:
            # every weight comes from the model file, and the step runs again from its start.
            self.settle()
            run()

    def finish_store_load(self, load: WeightLoad) -> None:
        load.wait()
        self._upload_rope()

    def _copied(self) -> dict[str, int]:
        """The weights a store load copies (name -> device address): all but those that point
        into the registered store mapping."""
        return {n: b.ptr for n, b in self.buffers.items() if n not in self._mapped}

    def load_weights(self, weights: Iterable[tuple[str, np.ndarray]]) -> None:
        if self._ring is None:
            raise RuntimeError("load_weights runs inside staging()")
        for name, arr in weights:
            buf = self.buffers[name]
            if arr.size * F32 != buf.nbytes:  # NOTE: never past a buffer, whatever the source
                raise ValueError(
                    f"weight {name}: {arr.size * F32} bytes for a buffer of {buf.nbytes}: the "
                    "model file is not the model the spec says"
                )
            self._ring.upload(buf.ptr, arr.astype(np.float32, copy=False))
        self._ring.synchronize()
        self._upload_rope()

    def _upload_rope(self) -> None:
        if self.rope_table is not None:
            self.dev.upload(self.rope_table, self.spec.rope.inv_freq())

    @property
    def maps_store(self) -> bool:
        """Whether weights point into a registered store mapping (weights="host" with a store)."""
        return self._registered is not None

    def close_gate(self) -> None:
        """Stops gating (the engine waited for the load first)."""
        if self.gate is not None:
            self.gate.close()
            self.gate, self._settle = None, None

    def release(self) -> None:
        """Frees the weights (and unregisters a mapped store); allocate may run again."""
        for name, buf in self.buffers.items():
            if name not in self._mapped:
                self.dev.free(buf)
        if self._registered is not None:
            self.dev.host_unregister(self._registered)
        if self.rope_table is not None:
            self.dev.free(self.rope_table)
        self.buffers, self._mapped, self._registered, self.rope_table = {}, set(), None, None
