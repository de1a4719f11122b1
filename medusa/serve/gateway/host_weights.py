"""Host-resident weights (`engine: {weights: host}`) the gateway owns: once a model's first
worker serves, its weight store is read (never mapped: a file cut short while mapped would kill
the gateway with SIGBUS) into a sealed memfd (medusa.weights.sealed), every chunk checked on the
sealed bytes, which nobody can change afterwards. Every later worker of the model is told the
copy's descriptor (MEDUSA_STORE_CHECKED), maps it, registers it for device reads and loads
without hashing: starting another worker, or switching a slice to the model, reads nothing from
disk, and what it serves is what was checked, whatever happens to the file since. The copy lives
while a worker of the model does and for its host_keep_alive after (default: keep_alive); its
bytes are counted once per model however many workers map it. (A worker started before the copy
is ready makes and checks a copy of its own.)"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING

from medusa.env import POOL_STORES_CHECKED, STORE_CHECKED
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
        self.errors: dict[str, str] = {}  # why a model's store could not be copied (logged once)
        self._last_live: dict[str, float] = {}
        self._opening: dict[str, asyncio.Task[None]] = {}

    def nbytes(self, model: str) -> int:
        s = self.stores.get(model)
        return s.nbytes if s is not None else 0

    def vouched(self, model: str) -> str:
        """The descriptor number of `model`'s sealed, checked copy while there is one; "" if
        none. A new worker is told it, so that it maps the copy and does not read and check
        every chunk again (70-90 ms of a pooled start for SmolLM2)."""
        s = self.stores.get(model)
        return str(s.fd) if s is not None else ""

    def worker_env(self, model: str) -> dict[str, str]:
        """`vouched` as a started worker's environment (MEDUSA_STORE_CHECKED)."""
        number = self.vouched(model)
        return {STORE_CHECKED.name: number} if number else {}

    def pool_env(self) -> dict[str, str]:
        """A pooled worker's environment: the checked copy of each resident model's store, by
        its artifact (MEDUSA_POOL_STORES_CHECKED), for the worker to map at warm-up."""
        copies = {
            str(Path(self.models[m].artifact or "").resolve()): s.fd for m, s in self.stores.items()
        }
        return {POOL_STORES_CHECKED.name: json.dumps(copies)} if copies else {}

    def need(self, model: str) -> None:
        """A worker of `model` serves: copy and check its store (in the background) unless done."""
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
        from medusa.weights.sealed import seal_store

        t0 = time.monotonic()
        try:
            store = await asyncio.to_thread(open_store, path, digest=digest)
            store = await asyncio.to_thread(seal_store, store, check=True)
        except (WeightStoreError, OSError) as e:
            # NOTE: logged once; the workers check the store too and load the model file instead.
            self.errors[model] = str(e)
            log.warning("%s: no checked copy of its weight store in the gateway: %s", model, e)
            return
        finally:
            self._opening.pop(model, None)
        self.stores[model] = store
        log.info(
            "%s: weight store copied and sealed (%.0f MiB, read and checked in %.2f s)",
            model,
            store.nbytes / 2**20,
            time.monotonic() - t0,
        )

    def expire(self, live: set[str]) -> None:
        """Frees the copies of models no worker has used for their host_keep_alive."""
        now = time.monotonic()
        for model in live:
            self._last_live[model] = now
        for model in [m for m in self.stores if m not in live]:
            if now - self._last_live.get(model, 0.0) > self.models[model].host_keep_alive:
                log.info("%s: weight store copy freed (no worker for host_keep_alive)", model)
                self.stores.pop(model).close()

    async def close(self) -> None:
        for task in list(self._opening.values()):
            task.cancel()
        for store in self.stores.values():
            store.close()
        self.stores.clear()
