"""Weaver's pairing in the gateway: a model whose models.yaml entry has `weaving: {enabled: true}`
(hot) borrows the device of an idle warm worker of a model without it (cold) for part of its
decode attention (medusa.weaver.hot; the workers' /weaving endpoints).

Every autoscaler tick:
- unpair first: a pair whose cold worker got busy (as many requests in flight as its model's
  `target`), or one of whose workers is no longer warm. The hot worker takes its sequences' KV
  back (they decode on locally, exactly) and stops the receiver; with the hot worker gone, the
  cold one is told to stop serving. Nothing is lost: a sequence whose KV cannot come back (the
  cold worker died) is prefilled again by the hot worker.
- then pair each warm, unpaired hot worker with a warm, unpaired cold worker with nothing in
  flight: of several, the one its tasks would wait least on (medusa.weaver.choice: the splitting
  model's expected wait on the cold worker's kernel times, from the workers' `GET /weaving`),
  ties to the one with the most free memory. A cold worker whose device has not the memory for
  `blocks` KV blocks (with elastic KV: whose page ledger cannot hold one offloaded sequence)
  refuses (409); a refused pairing is not tried again for `retry_after` seconds.
- the region is named, never a path: each worker makes or opens it in the private directory the
  gateway gave it at start (MEDUSA_WEAVING_DIR), and the /weaving routes answer only the
  gateway (the worker token). Workers of the ray back-end are not paired.
`release(inst)` unpairs a worker before the gateway stops it (scale-down, shutdown)."""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import httpx

from medusa.errors import FallbackError
from medusa.serve.gateway.config import ModelConfig
from medusa.weaver.choice import Candidate, WeavingProfile, rank_receivers
from medusa.weaver.config import WeavingConfig

log = logging.getLogger("medusa.gateway.weaving")

BLOCKS = 256  # KV blocks a receiver sets aside for the offloaded sequences
TIMEOUT = 60.0  # seconds for a worker to answer (an unpair fetches every offloaded sequence's KV)


class Worker(Protocol):
    """What pairing needs of a gateway instance (instances.Instance)."""

    model: str
    inflight: int
    state: Any  # instances.State

    @property
    def name(self) -> str: ...  # unique on its machine, fit for a file name

    def connect(self, timeout: float) -> httpx.AsyncClient: ...


def warm(w: Worker) -> bool:
    return bool(w.state.value == "warm")


@dataclass
class Pair:
    hot: Any  # Worker
    cold: Any  # Worker
    region: str


class PairingFailed(FallbackError, RuntimeError):
    """A worker refused or did not answer a /weaving request."""


def default_client(w: Worker) -> httpx.AsyncClient:
    return w.connect(TIMEOUT)


class WeavingPairs:
    def __init__(
        self,
        models: dict[str, ModelConfig],
        *,
        blocks: int = BLOCKS,
        retry_after: float = 30.0,
        client: Callable[[Worker], httpx.AsyncClient] = default_client,
        enabled: bool = True,
    ) -> None:
        """enabled: the back-end's workers can pair (they share a machine and the gateway's
        private directory, MEDUSA_WEAVING_DIR); if not, no worker is ever paired."""
        self.models, self.blocks, self.retry_after = models, blocks, retry_after
        self._client, self.enabled = client, enabled
        self._names = itertools.count(1)
        self.pairs: list[Pair] = []
        self._refused: dict[tuple[str, str], float] = {}  # (hot name, cold name) -> when

    def config(self, model: str) -> WeavingConfig:
        return getattr(self.models[model], "weaving", None) or WeavingConfig()

    def paired(self, w: Worker) -> Pair | None:
        return next((p for p in self.pairs if w in (p.hot, p.cold)), None)

    async def tick(self, workers: list[Worker]) -> None:
        if not self.enabled:
            return
        for p in list(self.pairs):
            why = self._unpair_reason(p)
            if why:
                await self._unpair(p, why)
        free = [w for w in workers if warm(w) and self.paired(w) is None]
        colds = [w for w in free if not self.config(w.model).enabled and w.inflight == 0]
        for hot in (w for w in free if self.config(w.model).enabled):
            for cold in await self._rank(hot, colds):
                if await self._pair(hot, cold):
                    colds.remove(cold)
                    break

    async def release(self, w: Worker) -> None:
        """Before `w` stops: its pairing ends (a hot worker's sequences come back first)."""
        p = self.paired(w)
        if p is not None:
            await self._unpair(p, f"{w.model} ({w.name}) is stopping")

    def _unpair_reason(self, p: Pair) -> str | None:
        if not warm(p.hot):
            return f"{p.hot.model} ({p.hot.name}) is no longer warm"
        if not warm(p.cold):
            return f"{p.cold.model} ({p.cold.name}) is no longer warm"
        target = self.models[p.cold.model].target
        if p.cold.inflight >= target:
            return f"{p.cold.model} is busy ({p.cold.inflight} requests in flight, target {target})"
        return None

    def _refused_lately(self, hot: Worker, cold: Worker) -> bool:
        when = self._refused.get((hot.name, cold.name), -1e9)
        return time.monotonic() - when < self.retry_after

    async def _rank(self, hot: Worker, colds: list[Worker]) -> list[Worker]:
        """`colds` that `hot` may try, best first (medusa.weaver.choice)."""
        colds = [c for c in colds if not self._refused_lately(hot, c)]
        if len(colds) < 2:
            return colds
        mine, _ = await self._describe(hot)
        cands = [Candidate(c, *(await self._describe(c))) for c in colds]
        return rank_receivers(mine, self.config(hot.model).ratio, cands)

    async def _describe(self, w: Worker) -> tuple[WeavingProfile | None, int]:
        """A worker's profile and free memory from its `GET /weaving`; (None, 0) if it does not
        say (it goes last)."""
        try:
            async with self._client(w) as c:
                r = await c.get("/weaving")
            r.raise_for_status()
            body = r.json()
            return WeavingProfile.from_json(body["profile"]), int(body["free_bytes"])
        except (httpx.HTTPError, ValueError, KeyError, TypeError) as e:
            log.warning("weaving: %s (%s) has no usable profile: %r", w.model, w.name, e)
            return None, 0

    async def _pair(self, hot: Worker, cold: Worker) -> bool:
        key = (hot.name, cold.name)
        if self._refused_lately(hot, cold):
            return False
        region = f"weaver-{next(self._names)}"  # a name in the workers' MEDUSA_WEAVING_DIR
        try:
            await self._post(hot, "/weaving/offload",
                             {"region": region, "ratio": self.config(hot.model).ratio})  # fmt: skip
        except PairingFailed as e:
            self._refused[key] = time.monotonic()
            log.warning("weaving: %s cannot offload: %s", hot.model, e)
            return False
        try:
            await self._post(cold, "/weaving/receive", {"region": region, "blocks": self.blocks})
        except PairingFailed as e:
            self._refused[key] = time.monotonic()
            log.warning("weaving: %s cannot receive for %s: %s", cold.model, hot.model, e)
            await self._post_quietly(hot, "/weaving/unpair")
            return False
        self.pairs.append(Pair(hot, cold, region))
        log.info("weaving: %s (%s) offloads %.0f%% of its sequences to %s (%s)",
                 hot.model, hot.name, 100 * self.config(hot.model).ratio, cold.model,
                 cold.name)  # fmt: skip
        return True

    async def _unpair(self, p: Pair, why: str) -> None:
        self.pairs.remove(p)
        log.info("weaving: unpairing %s from %s: %s", p.hot.model, p.cold.model, why)
        # NOTE: the hot worker first: it fetches its sequences' KV back from the cold one, then
        # stops it. A dead one refuses the connection at once; its cold worker then stops here.
        await self._post_quietly(p.hot, "/weaving/unpair")
        await self._post_quietly(p.cold, "/weaving/unpair")

    async def _post(self, w: Worker, path: str, body: dict[str, Any] | None = None) -> None:
        try:
            async with self._client(w) as c:
                r = await c.post(path, json=body or {})
        except httpx.HTTPError as e:
            raise PairingFailed(f"{path}: {e!r}") from None
        if r.status_code != 200:
            raise PairingFailed(f"{path}: {r.status_code} {r.text[:300]}")

    async def _post_quietly(self, w: Worker, path: str) -> None:
        try:
            await self._post(w, path)
        except PairingFailed as e:
            log.warning("weaving: %s (%s): %s", w.model, w.name, e)
