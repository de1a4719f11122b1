"""Host-resident weights (`engine: {weights: host}`) the gateway owns: each such model's weight
store is mapped once here, read-only and shared, once its first worker serves, and read through
once (every chunk checked against its checksum, so a damaged store is reported here) so every
worker of the model (each maps the same file, MAP_SHARED, and registers it for device
reads) finds them in memory: starting another worker, or switching a slice to the model, loads
nothing from disk. The mapping lives while a worker of the model does and for its keep_alive
after; its bytes are counted once per model however many workers map it."""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING

from medusa.serve.gateway.config import ModelConfig

if TYPE_CHECKING:
    from medusa.weights import WeightStore

log = logging.getLogger("medusa.gateway")


def store_of(m: ModelConfig) -> tuple[Path, str | None] | None:
    """The weight store a host-weight model's workers map (and the header digest its artifact's
    manifest seals), or None: not host weights, no artifact, or an artifact without a store."""
    if m.engine.get("weights") != "host" or not m.artifact:
        return None
    from medusa.artifact.store import read_manifest

    try:
        entry = read_manifest(Path(m.artifact)).get("weights")
    except (OSError, ValueError):
        return None
    if not isinstance(entry, dict) or not isinstance(entry.get("file"), str):
        return None
    digest = entry.get("header_sha256")
    return Path(m.artifact) / entry["file"], digest if isinstance(digest, str) else None


class HostWeights:
    def __init__(self, models: dict[str, ModelConfig]) -> None:
        self.models = models
        self.stores: dict[str, WeightStore] = {}
        self.errors: dict[str, str] = {}  # why a model's store could not be mapped (logged once)
        self._last_live: dict[str, float] = {}
        self._opening: dict[str, asyncio.Task[None]] = {}

    def nbytes(self, model: str) -> int:
        s = self.stores.get(model)
        return s.nbytes if s is not None else 0

    def need(self, model: str) -> None:
        """A worker of `model` serves: map its store (in the background) unless mapped."""
        self._last_live[model] = time.monotonic()
        if model in self.stores or model in self._opening or model in self.errors:
            return
        where = store_of(self.models[model])
        if where is None:
            return
        task = asyncio.get_running_loop().create_task(self._open(model, *where))
        self._opening[model] = task

    async def _open(self, model: str, path: Path, digest: str | None) -> None:
        from medusa.weights import WeightStoreError, open_store

        t0 = time.monotonic()
        store = None
        try:
            store = await asyncio.to_thread(open_store, path, digest=digest)
            await asyncio.to_thread(store.verify)  # reads every page in, too
        except (WeightStoreError, OSError) as e:
            if store is not None:
                store.close()
            # NOTE: logged once; the workers check the store too and load the model file instead.
            self.errors[model] = str(e)
            log.warning("%s: its weight store is not mapped by the gateway: %s", model, e)
            return
        finally:
            self._opening.pop(model, None)
        self.stores[model] = store
        log.info(
            "%s: weight store mapped (%.0f MiB, read and checked in %.2f s)",
            model,
            store.nbytes / 2**20,
            time.monotonic() - t0,
        )

    def expire(self, live: set[str]) -> None:
        """Unmaps the stores of models no worker has used for their keep_alive."""
        now = time.monotonic()
        for model in live:
            self._last_live[model] = now
        for model in [m for m in self.stores if m not in live]:
            if now - self._last_live.get(model, 0.0) > self.models[model].keep_alive:
                log.info("%s: weight store unmapped (no worker for keep_alive)", model)
                self.stores.pop(model).close()

    async def close(self) -> None:
        for task in list(self._opening.values()):
            task.cancel()
        for store in self.stores.values():
            store.close()
        self.stores.clear()
