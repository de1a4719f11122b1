"""Host-resident weights (`engine: {weights: host}`) the gateway owns: each such model's weight
store is mapped once here, read-only and shared, once its first worker serves, and read through
once (every chunk checked against its checksum, so a damaged store is reported here) so every
worker of the model (each maps the same file, MAP_SHARED, and registers it for device
reads) finds them in memory: starting another worker, or switching a slice to the model, loads
nothing from disk. The mapping lives while a worker of the model does and for its
host_keep_alive after (default: keep_alive); its bytes are counted once per model however many
workers map it. Workers are told the identity of a store checked here and skip their own pass."""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING

from medusa.env import STORE_CHECKED
from medusa.serve.gateway.config import ModelConfig
from medusa.weights.store import RACY_SECONDS

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
        self._checked: dict[str, str] = {}  # model -> identity of the store checked in full
        self._opening: dict[str, asyncio.Task[None]] = {}

    def nbytes(self, model: str) -> int:
        s = self.stores.get(model)
        return s.nbytes if s is not None else 0

    def vouched(self, model: str) -> str:
        """The identity of `model`'s store while it is mapped here, read and checked in full; ""
        if none. A new worker is told it, so that, mapping the same unchanged file, it does not
        read and check every chunk again (70-90 ms of a pooled start for SmolLM2)."""
        return self._checked.get(model, "") if model in self.stores else ""

    def worker_env(self, model: str) -> dict[str, str]:
        """`vouched` as a started worker's environment (MEDUSA_STORE_CHECKED)."""
        identity = self.vouched(model)
        return {STORE_CHECKED.name: identity} if identity else {}

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

        t0, began = time.monotonic(), time.time_ns()
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
        # NOTE: file times are coarse (a few ms): a file changed just before the check could be
        # changed again with the same times. Like git's racy-clean rule, only a store unchanged
        # for RACY_SECONDS before the check is vouched for; otherwise workers check it themselves.
        if store.identity and store.mtime_ns < began - int(RACY_SECONDS * 1e9):
            self._checked[model] = store.identity
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
            if now - self._last_live.get(model, 0.0) > self.models[model].host_keep_alive:
                log.info("%s: weight store unmapped (no worker for host_keep_alive)", model)
                self.stores.pop(model).close()
                self._checked.pop(model, None)

    async def close(self) -> None:
        for task in list(self._opening.values()):
            task.cancel()
        for store in self.stores.values():
            store.close()
        self.stores.clear()
