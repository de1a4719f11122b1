"""A worker's Weaver endpoints, for the gateway's pairing (medusa.serve.gateway.weaving):

    POST /weaving/offload {region, ratio}   this (hot) engine creates the region and offloads
    POST /weaving/receive {region, blocks}  this (cold) engine serves that region between kernels
    POST /weaving/unpair                    hot: takes its sequences' KV back and stops the
                                            receiver; cold: stops serving (what it held is lost)
    GET  /weaving                           what this worker offloads or serves, and what
                                            the gateway chooses receivers by: its profile
                                            (kernel and attention times, measured once) and
                                            the memory free for offloaded KV

Each runs on the engine thread between two steps.

They are the gateway's only: mounted only on a worker started with MEDUSA_WORKER_TOKEN (every
route then needs it) and MEDUSA_WEAVING_DIR, the private directory the gateway made for its
workers' regions; elsewhere (a standalone `medusa run`) /weaving answers 404 and says why. A
region is a name in that directory (medusa.weaver.region_dir), never a path; a bad name, or a
region file that is not a private exchange region of this user, gets 400."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI
from pydantic import BaseModel, Field

from medusa import env
from medusa.engine.llm_engine import LLMEngine
from medusa.serve.async_engine import AsyncEngine
from medusa.serve.protocol import APIError
from medusa.weaver import cold as cold_side
from medusa.weaver import hot as hot_side
from medusa.weaver.offload import WeavingLink
from medusa.weaver.region import RegionError
from medusa.weaver.region_dir import NAME, RegionDir

log = logging.getLogger("medusa.serve")
TIMEOUT = 60.0  # seconds for the engine thread to take a command (a step of a long prefill)


MAX_BLOCKS = 1 << 20  # KV blocks a receiver may be asked to set aside (memory decides first)


class Offload(BaseModel):
    region: str = Field(pattern=f"^{NAME}$")
    ratio: float = Field(gt=0.0, le=1.0)


class Receive(BaseModel):
    region: str = Field(pattern=f"^{NAME}$")
    blocks: int = Field(ge=1, le=MAX_BLOCKS)


def mount_weaving(
    app: FastAPI, engine: AsyncEngine, ready: Callable[[], None], token: str, where: str
) -> None:
    """The /weaving routes, for the gateway's pairing: only with the worker token (the gateway
    alone calls them) and its private directory of exchange regions (`where`)."""
    if not token:
        return weaving_off(app, f"it was not started by a gateway ({env.WORKER_TOKEN.name} unset)")
    if not where:
        return weaving_off(app, f"the gateway gave it no {env.WEAVING_DIR.name}")
    try:
        regions = RegionDir(where)
    except RegionError as e:
        log.warning("weaving is off: %s", e)
        return weaving_off(app, str(e))
    add_weaving_routes(app, engine, ready, regions)


def weaving_off(app: FastAPI, why: str) -> None:
    """/weaving on a worker that does not weave: 404 with the reason."""

    @app.api_route("/weaving", methods=["GET", "POST"])
    @app.api_route("/weaving/{rest:path}", methods=["GET", "POST"])
    async def off(rest: str = "") -> None:
        raise APIError(404, f"weaving is off on this worker: {why}", code="weaving_off")


def add_weaving_routes(
    app: FastAPI, engine: AsyncEngine, ready: Callable[[], None], regions: RegionDir
) -> None:
    """The routes, over the exchange regions named in `regions`."""

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
        link = WeavingLink(regions.where(req.region), req.ratio, dir_fd=regions.fd)
        await run(lambda e: hot_side.pair(e, link))
        return await _state()

    @app.post("/weaving/receive")
    async def receive(req: Receive) -> dict[str, Any]:
        where = regions.where(req.region)
        await run(lambda e: cold_side.receive(e, where, req.blocks, regions.fd))
        return await _state()

    @app.post("/weaving/unpair")
    async def unpair() -> dict[str, Any]:
        def both(e: LLMEngine) -> None:
            hot_side.unpair(e)
            cold_side.stop_receiving(e)

        await run(both)
        return await _state()

    profile: list[dict[str, Any]] = []  # measured at the first GET, then kept

    def choice(e: LLMEngine) -> dict[str, Any]:
        from medusa.weaver.profile import free_bytes, measure

        if not profile:
            profile.append(measure(e.runner).to_json())
        return {"profile": profile[0], "free_bytes": free_bytes(e.runner, e.device)}

    @app.get("/weaving")
    async def status() -> dict[str, Any]:
        out = await _state()
        return {**out, **(await run(choice))}

    async def _state() -> dict[str, Any]:
        e = engine.engine
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
