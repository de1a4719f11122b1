"""A worker's Weaver endpoints, for the gateway's pairing (medusa.serve.gateway.weaving):

    POST /weaving/offload {region, ratio}   this (hot) engine creates the region and offloads
    POST /weaving/receive {region, blocks}  this (cold) engine serves that region between kernels
    POST /weaving/unpair                    hot: takes its sequences' KV back and stops the
                                            receiver; cold: stops serving (what it held is lost)
    GET  /weaving                           what this worker offloads or serves, and what
                                            the gateway chooses receivers by: its profile
                                            (kernel and attention times, measured once) and
                                            the memory free for offloaded KV

Each runs on the engine thread between two steps."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI
from pydantic import BaseModel, Field

from medusa.engine.llm_engine import LLMEngine
from medusa.engine.weaving import WeavingLink
from medusa.serve.async_engine import AsyncEngine
from medusa.serve.protocol import APIError
from medusa.weaver.region import RegionError

TIMEOUT = 60.0  # seconds for the engine thread to take a command (a step of a long prefill)


class Offload(BaseModel):
    region: str = Field(min_length=1)
    ratio: float = Field(gt=0.0, le=1.0)


class Receive(BaseModel):
    region: str = Field(min_length=1)
    blocks: int = Field(ge=1)


def add_weaving_routes(app: FastAPI, engine: AsyncEngine, ready: Callable[[], None]) -> None:
    async def run(fn: Callable[[LLMEngine], Any]) -> Any:
        ready()
        try:
            return await asyncio.wait_for(engine.call(fn), TIMEOUT)
        except RegionError as e:
            raise APIError(400, str(e), param="region") from None
        except (RuntimeError, MemoryError, OSError) as e:  # paired already, no memory, file taken
            raise APIError(409, str(e), kind="conflict") from None

    @app.post("/weaving/offload")
    async def offload(req: Offload) -> dict[str, Any]:
        await run(lambda e: e.pair(WeavingLink(req.region, req.ratio)))
        return await _state()

    @app.post("/weaving/receive")
    async def receive(req: Receive) -> dict[str, Any]:
        await run(lambda e: engine.receive(req.region, req.blocks))
        return await _state()

    @app.post("/weaving/unpair")
    async def unpair() -> dict[str, Any]:
        def both(e: LLMEngine) -> None:
            e.unpair()
            engine.stop_receiving()

        await run(both)
        return await _state()

    profile: list[dict[str, Any]] = []  # measured at the first GET, then kept

    def choice(e: LLMEngine) -> dict[str, Any]:
        from medusa.engine.weaving_profile import free_bytes, measure

        if not profile:
            profile.append(measure(e.runner).to_json())
        return {"profile": profile[0], "free_bytes": free_bytes(e.runner, e.device)}

    @app.get("/weaving")
    async def status() -> dict[str, Any]:
        out = await _state()
        return {**out, **(await run(choice))}

    async def _state() -> dict[str, Any]:
        e, r = engine.engine, engine.receiver
        w = e.weaving if e is not None else None
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
