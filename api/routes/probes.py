"""The open routes a probe or a scraper calls without a token: `/livez`, `/readyz`, `/metrics`.

`/livez` is the daemon's own loop (a stuck loop is a 503, so a kubelet or systemd restarts the
daemon); `/readyz` is `api.readiness.is_ready` of the snapshot.
"""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter
from prometheus_client import generate_latest
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from starlette.responses import JSONResponse, Response

from api.deps import Context, Supervisor
from api.models import Liveness, Readiness
from api.readiness import is_ready
from api.responses import OPEN_OPERATION

router = APIRouter(tags=["probes"])


# A route, not a mounted prometheus_client app: a mount would negotiate OpenMetrics with a
# Prometheus that asks for it (changing what every scrape gets) and would not be in /openapi.json.
@router.get(
    "/metrics",
    response_class=Response,
    responses={200: {"description": "Prometheus text format 0.0.4", "content": {"text/plain": {}}}},
    openapi_extra=OPEN_OPERATION,
)
async def metrics(ctx: Context) -> Response:
    body = ctx.scrapes.get(lambda: generate_latest(ctx.registry), asyncio.get_running_loop().time())
    return Response(body, media_type=CONTENT_TYPE_PLAIN_0_0_4)


@router.get(
    "/livez",
    response_model=Liveness,
    responses={503: {"model": Liveness, "description": "the supervisor loop is stuck"}},
    openapi_extra=OPEN_OPERATION,
)
async def livez(handle: Supervisor, ctx: Context) -> Any:
    """The daemon's own loop is alive (not whether the server is)."""
    handle.snapshot()
    if ctx.liveness is None:
        return Liveness(ok=True)
    age = ctx.liveness()
    if age > ctx.liveness_max_age_s:
        body = Liveness(
            ok=False,
            loop_heartbeat_age_s=age,
            detail=f"the supervisor loop has not run for {age:.1f} s (limit {ctx.liveness_max_age_s:g} s)",
        )
        return JSONResponse(body.model_dump(mode="json"), status_code=503)
    return Liveness(ok=True, loop_heartbeat_age_s=age)


@router.get(
    "/readyz",
    response_model=Readiness,
    responses={503: {"model": Readiness, "description": "the server is not serving"}},
    openapi_extra=OPEN_OPERATION,
)
async def readyz(handle: Supervisor) -> Any:
    """The server is serving: state `ready` or `degraded`."""
    snapshot = handle.snapshot()
    body = Readiness(ready=is_ready(snapshot), state=snapshot.state)
    return body if body.ready else JSONResponse(body.model_dump(mode="json"), status_code=503)
