"""What the worker's /weaving routes do (medusa.serve.weaving_routes), each on the engine thread
between two steps: offload to an exchange region, serve one, stop either, and describe this
worker to the gateway that chooses receivers."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from medusa.engine.llm_engine import LLMEngine
from medusa.serve.async_engine import AsyncEngine
from medusa.serve.protocol import APIError
from medusa.serve.serving import require_ready
from medusa.weaver import cold as cold_side
from medusa.weaver import hot as hot_side
from medusa.weaver.offload import WeavingLink
from medusa.weaver.region import RegionError
from medusa.weaver.region_dir import RegionDir

TIMEOUT = 60.0  # seconds for the engine thread to take a command (a step of a long prefill)


class ServingWeaving:
    """Over the exchange regions named in `regions` (the gateway's private directory)."""

    def __init__(self, engine: AsyncEngine, regions: RegionDir) -> None:
        self.engine, self.regions = engine, regions
        self._profile: dict[str, Any] | None = None  # measured at the first status, then kept

    async def _run(self, fn: Callable[[LLMEngine], Any]) -> Any:
        require_ready(self.engine)
        try:
            return await asyncio.wait_for(self.engine.call(fn), TIMEOUT)
        except RegionError as e:
            raise APIError(400, str(e), param="region") from None
        except (RuntimeError, MemoryError, OSError) as e:  # paired already, no memory, file taken
            raise APIError(409, str(e), kind="conflict") from None

    async def offload(self, region: str, ratio: float) -> dict[str, Any]:
        link = WeavingLink(self.regions.where(region), ratio, dir_fd=self.regions.fd)
        await self._run(lambda e: hot_side.pair(e, link))
        return self.state()

    async def receive(self, region: str, blocks: int) -> dict[str, Any]:
        where = self.regions.where(region)
        await self._run(lambda e: cold_side.receive(e, where, blocks, self.regions.fd))
        return self.state()

    async def unpair(self) -> dict[str, Any]:
        def both(e: LLMEngine) -> None:
            hot_side.unpair(e)
            cold_side.stop_receiving(e)

        await self._run(both)
        return self.state()

    async def status(self) -> dict[str, Any]:
        out = self.state()
        return {**out, **(await self._run(self._choice))}

    def _choice(self, e: LLMEngine) -> dict[str, Any]:
        from medusa.weaver.profile import free_bytes, measure

        if self._profile is None:
            self._profile = measure(e.runner).to_json()
        return {"profile": self._profile, "free_bytes": free_bytes(e.runner, e.device)}

    def state(self) -> dict[str, Any]:
        """What this worker offloads (hot) or serves (cold)."""
        e = self.engine.engine
        w = hot_side.hot_weaving(e) if e is not None else None
        r = cold_side.cold_weaving(e) if e is not None else None
        hot = None
        if w is not None:
            hot = {"region": str(w.region.path), "ratio": w.ratio, "receiving": w.receiving,
                   "offloaded": len(w.offloaded), "num_offloaded": w.num_offloaded,
                   "num_recomputed": w.num_recomputed, "error": w.error}  # fmt: skip
        cold = None
        if r is not None:
            cold = {"region": str(r.region.path), "served": r.receiver.served,
                    "held": len(r.receiver.tables), "kv": r.receiver.kv.describe()}  # fmt: skip
        return {"offloading": hot, "receiving": cold}
