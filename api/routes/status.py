"""`GET /status`: the supervisor's snapshot, as it was last published."""

from __future__ import annotations

from fastapi import APIRouter

from api.deps import Supervisor
from supervisor.status.snapshot import StatusSnapshot

router = APIRouter(tags=["status"])


@router.get("/status", response_model=StatusSnapshot)
async def status(handle: Supervisor) -> StatusSnapshot:
    return handle.snapshot()
