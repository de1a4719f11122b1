"""A worker's Weaver endpoints, for the gateway's pairing (medusa.serve.gateway.weaving):

    POST /weaving/offload {region, ratio}   this (hot) engine creates the region and offloads
    POST /weaving/receive {region, blocks}  this (cold) engine serves that region between kernels
    POST /weaving/unpair                    hot: takes its sequences' KV back and stops the
                                            receiver; cold: stops serving (what it held is lost)
    GET  /weaving                           what this worker offloads or serves, and what
                                            the gateway chooses receivers by: its profile
                                            (kernel and attention times, measured once) and
                                            the memory free for offloaded KV

Each runs on the engine thread between two steps (medusa.serve.serving_weaving).

They are the gateway's only: mounted only on a worker started with MEDUSA_WORKER_TOKEN (every
route then needs it) and MEDUSA_WEAVING_DIR, the private directory the gateway made for its
workers' regions; elsewhere (a standalone `medusa run`) /weaving answers 404 and says why. A
region is a name in that directory (medusa.weaver.region_dir), never a path; a bad name, or a
region file that is not a private exchange region of this user, gets 400."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from pydantic import BaseModel, Field

from medusa import env
from medusa.serve.protocol import APIError
from medusa.serve.serving_weaving import ServingWeaving
from medusa.weaver.region import RegionError
from medusa.weaver.region_dir import NAME, RegionDir

log = logging.getLogger("medusa.serve")

MAX_BLOCKS = 1 << 20  # KV blocks a receiver may be asked to set aside (memory decides first)


class Offload(BaseModel):
    region: str = Field(pattern=f"^{NAME}$")
    ratio: float = Field(gt=0.0, le=1.0)


class Receive(BaseModel):
    region: str = Field(pattern=f"^{NAME}$")
    blocks: int = Field(ge=1, le=MAX_BLOCKS)


router = APIRouter()  # over app.state.weaving
off_router = APIRouter()  # app.state.weaving_off says why


@router.post("/weaving/offload")
async def offload(req: Offload, request: Request) -> dict[str, Any]:
    return await request.app.state.weaving.offload(req.region, req.ratio)


@router.post("/weaving/receive")
async def receive(req: Receive, request: Request) -> dict[str, Any]:
    return await request.app.state.weaving.receive(req.region, req.blocks)


@router.post("/weaving/unpair")
async def unpair(request: Request) -> dict[str, Any]:
    return await request.app.state.weaving.unpair()


@router.get("/weaving")
async def status(request: Request) -> dict[str, Any]:
    return await request.app.state.weaving.status()


@off_router.api_route("/weaving", methods=["GET", "POST"])
@off_router.api_route("/weaving/{rest:path}", methods=["GET", "POST"])
async def off(request: Request, rest: str = "") -> None:
    why = request.app.state.weaving_off
    raise APIError(404, f"weaving is off on this worker: {why}", code="weaving_off")


def include_weaving(app: FastAPI, token: str, where: str) -> None:
    """The /weaving routes, for the gateway's pairing: only with the worker token (the gateway
    alone calls them) and its private directory of exchange regions (`where`); else the routes
    that say why they are off."""
    if not token:
        why = f"it was not started by a gateway ({env.WORKER_TOKEN.name} unset)"
    elif not where:
        why = f"the gateway gave it no {env.WEAVING_DIR.name}"
    else:
        try:
            app.state.weaving = ServingWeaving(app.state.engine, RegionDir(where))
            app.include_router(router)
            return
        except RegionError as e:
            log.warning("weaving is off: %s", e)
            why = str(e)
    app.state.weaving_off = why
    app.include_router(off_router)
