"""The group's member API: what node 0's daemon asks of every other node's daemon (docs/API.md).

`GET /group/report` (this node's report), `POST /group/capture` (a bundle under the leader's
incident id, now), `POST /group/stop` (stop and verify the tree; answers once it is stopped),
`POST /group/launch` (the rung the group launches). Same bearer token as every route (the auth
middleware covers `/group/*`). The routes only read the snapshot and submit commands.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from typing import Annotated, Any, Protocol

from fastapi import APIRouter, Body, Depends, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from api.errors import error_response
from supervisor.diagnostics.culprit import NONE_NAMED
from supervisor.group.joining import JoinAnswer
from supervisor.group.report import to_wire
from supervisor.group.verdict import NodeReport
from supervisor.status.commands import Command, CommandResult
from supervisor.status.snapshot import StatusSnapshot

INCIDENT_ID = r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$"  # a directory name: no "/", no ".." at the start
STOP_POLL_S = 0.2
GROUP_SIGNER = "group_signer"  # the scope key api/groupgate.py sets: which node's key signed the request


class GroupHandle(Protocol):
    """What the group routes need of the daemon."""

    def snapshot(self) -> StatusSnapshot: ...

    def group_report(self) -> NodeReport: ...

    async def submit(self, command: Command) -> CommandResult: ...

    def join(
        self, node: int, instance: str, fingerprint: Mapping[str, str], check: bool, identity: str, address: str
    ) -> JoinAnswer: ...


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class CaptureRequest(_Request):
    incident: str = Field(pattern=INCIDENT_ID, description="the leader's incident id: this node's bundle gets it too")


class StopGroupRequest(_Request):
    timeout_s: float = Field(default=300.0, gt=0, le=3600, description="answer 504 if not stopped by then")


class LaunchRequest(_Request):
    rung: str = Field(min_length=1, max_length=128, description="the rung the whole group launches")


FingerprintValue = Annotated[str, StringConstraints(max_length=256)]


class JoinRequest(_Request):
    node: int = Field(ge=1, le=4096, description="the joining node's node_rank (its key signed the request)")
    instance: str = Field(pattern=r"^[0-9a-f]{32}$", description="the joining daemon's id for its life")
    fingerprint: dict[Annotated[str, StringConstraints(max_length=128)], FingerprintValue] = Field(max_length=512)
    rung: str | None = Field(default=None, max_length=128, description="the rung it would launch")
    check: bool = Field(default=False, description="only ask (check-config --group): nothing is recorded")
    identity: str = Field(
        default="", pattern=r"^([0-9a-f]{32})?$", description="the joining daemon's state directory, hashed"
    )
    address: str = Field(default="", max_length=256, description="the joining daemon's API address, for naming")


class CaptureResult(BaseModel):
    node: int
    incident: str
    bundle_id: str | None
    message: str
    state: str
    culprit: str | None = None  # the bundle's culprit line, for the leader's group summary (issue 35)


class GroupCommandResult(BaseModel):
    node: int
    state: str
    message: str
    last_stop: dict[str, Any] | None = None


def get_group(request: Request) -> GroupHandle:
    handle: GroupHandle = request.app.state.group
    return handle


router = APIRouter(prefix="/group", tags=["group"])
Handle = Annotated[GroupHandle, Depends(get_group)]


def _refused(result: CommandResult) -> Any:
    status = {"conflict": 409, "busy": 429, "invalid": 400}.get(result.outcome, 503)
    return error_response(status, result.outcome, result.message or result.outcome, state=result.state or None)


@router.get("/report")
async def report(handle: Handle) -> dict[str, Any]:
    """This node's report: state, phase, pid, rung, ranks and their states, a held verdict."""
    return to_wire(handle.group_report())


@router.post("/capture", response_model=CaptureResult)
async def capture(body: Annotated[CaptureRequest, Body()], handle: Handle) -> Any:
    """Capture this node's bundle under the leader's incident id; answers when it is written."""
    result = await handle.submit(Command(kind="diagnose", incident_id=body.incident, source="group"))
    if result.outcome not in ("accepted", "done"):
        return _refused(result)
    node = handle.group_report().node
    return CaptureResult(
        node=node,
        incident=body.incident,
        bundle_id=result.bundle_id,
        message=result.message,
        state=result.state or handle.snapshot().state,
        culprit=_culprit(result.summary),
    )


def _culprit(summary: object) -> str | None:
    """The bundle's first line for a hang: its culprit, or that none could be named."""
    if not isinstance(summary, dict) or summary.get("hang_class") is None:
        return None
    doc = summary.get("culprit")
    text = doc.get("text") if isinstance(doc, dict) else None
    return str(text)[:300] if text else NONE_NAMED


@router.post("/stop", response_model=GroupCommandResult)
async def stop(handle: Handle, body: Annotated[StopGroupRequest | None, Body()] = None) -> Any:
    """Stop this node's server and verify the release; answers once the state is `stopped`."""
    req = body or StopGroupRequest()
    result = await handle.submit(Command(kind="stop", reason="stopped for the group by its leader", source="group"))
    if result.outcome not in ("accepted", "done"):
        return _refused(result)
    deadline = time.monotonic() + req.timeout_s
    while handle.snapshot().state != "stopped":
        if time.monotonic() >= deadline:
            snap = handle.snapshot()
            return error_response(504, "timeout", f"not stopped after {req.timeout_s:g} s", state=snap.state)
        await asyncio.sleep(STOP_POLL_S)
    snap = handle.snapshot()
    stop_view = snap.last_stop.model_dump() if snap.last_stop is not None else None
    return GroupCommandResult(node=handle.group_report().node, state=snap.state, message="stopped", last_stop=stop_view)


@router.post("/launch", response_model=GroupCommandResult, status_code=202)
async def launch(body: Annotated[LaunchRequest, Body()], handle: Handle) -> Any:
    """Launch this node's server on the group's rung."""
    ladder = handle.snapshot().ladder
    if ladder and body.rung not in ladder:
        return error_response(404, "unknown_rung", f"no rung named {body.rung!r}", rungs=list(ladder))
    result = await handle.submit(
        Command(kind="start", rung=body.rung, reason="launched by the group's leader", source="group")
    )
    if result.outcome not in ("accepted", "done"):
        return _refused(result)
    snap = handle.snapshot()
    return GroupCommandResult(node=handle.group_report().node, state=result.state or snap.state, message=result.message)


@router.post("/join")
async def join(body: Annotated[JoinRequest, Body()], request: Request, handle: Handle) -> Any:
    """The leader's answer to a member about to launch: the group's rung, wait, or refused (409,
    naming the config keys that differ, or the daemon that already has this node_rank and this one)."""
    signer = request.scope.get(GROUP_SIGNER)
    if signer != body.node:
        return error_response(403, "forbidden", f"signed as node {signer}, joining as node {body.node}")
    ans = handle.join(body.node, body.instance, body.fingerprint, body.check, body.identity, body.address)
    doc = {"verdict": ans.verdict, "rung": ans.rung, "reason": ans.reason, "differs": list(ans.differs)}
    if ans.verdict == "refused":
        return JSONResponse({"error": "refused", "detail": ans.reason, "differs": list(ans.differs)}, status_code=409)
    return doc
