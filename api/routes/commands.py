"""The commands: `POST /restart`, `/diagnose`, `/stop`, `/start`, `/reload`, `/promote`.

Each route checks what it can from the snapshot (an unknown rung), puts one `Command` on the
supervisor's queue and turns its `CommandResult` into an answer; it never touches a process.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends
from starlette.responses import JSONResponse

from api import promote as promote_rule
from api.deps import Requester, Supervisor, non_simple
from api.errors import error_response
from api.models import (
    CommandAccepted,
    DiagnoseRequest,
    DiagnoseResult,
    PromoteRequest,
    RestartAccepted,
    RestartRequest,
    StartRequest,
    StopRequest,
)
from api.responses import BAD_REQUEST, CONFLICT, NO_RUNG, SIMPLE_POST
from supervisor.status.commands import Command, CommandResult, SupervisorHandle
from supervisor.status.snapshot import StatusSnapshot

BUSY_RETRY_AFTER_S = 5

# Every command changes something: none may come from a web page (api/browser.py).
router = APIRouter(
    tags=["commands"], responses={**BAD_REQUEST, **CONFLICT, **SIMPLE_POST}, dependencies=[Depends(non_simple)]
)


def refusal(result: CommandResult, snapshot: StatusSnapshot) -> JSONResponse | None:
    """The error response for an outcome other than accepted/done, or None for success."""
    state = result.state or snapshot.state
    if result.outcome in ("accepted", "done"):
        return None
    if result.outcome == "conflict":
        return error_response(409, "conflict", result.message or f"conflicts with state {state}", state=state)
    if result.outcome == "busy":
        return error_response(
            429,
            "busy",
            result.message or "the supervisor is busy with the same work",
            state=state,
            headers={"Retry-After": str(BUSY_RETRY_AFTER_S)},
        )
    if result.outcome == "invalid":
        return error_response(
            400, "invalid", result.message or "refused", state=state, rungs=list(snapshot.ladder) or None
        )
    return error_response(503, "failed", result.message or "the supervisor could not carry it out", state=state)


def unknown_rung(rung: str, ladder: tuple[str, ...], message: str = "") -> JSONResponse:
    known = f"the ladder has: {', '.join(ladder)}" if ladder else "the ladder is not loaded yet"
    detail = f"{message or f'no rung named {rung!r}'}; {known}"
    return error_response(404, "unknown_rung", detail, rungs=list(ladder))


async def _submit(handle: SupervisorHandle, command: Command) -> tuple[CommandResult, JSONResponse | None]:
    result = await handle.submit(command)
    return result, refusal(result, handle.snapshot())


async def _accepted(handle: SupervisorHandle, command: Command) -> Any:
    result, refused = await _submit(handle, command)
    if refused is not None:
        return refused
    return CommandAccepted(state=result.state or handle.snapshot().state, message=result.message)


@router.post("/restart", status_code=202, response_model=RestartAccepted, responses=NO_RUNG)
async def restart(handle: Supervisor, by: Requester, body: Annotated[RestartRequest | None, Body()] = None) -> Any:
    """Restart the server (stop, verify release, relaunch), optionally on a given rung."""
    req = body or RestartRequest()
    ladder = handle.snapshot().ladder
    if req.rung is not None and ladder and req.rung not in ladder:
        return unknown_rung(req.rung, ladder)
    command = Command(kind="restart", rung=req.rung, reason=req.reason, diagnose=req.diagnose, requested_by=by)
    result, refused = await _submit(handle, command)
    ladder = handle.snapshot().ladder
    if result.outcome == "invalid" and req.rung is not None and req.rung not in ladder:
        return unknown_rung(req.rung, ladder, result.message)
    if refused is not None:
        return refused
    state = result.state or handle.snapshot().state
    return RestartAccepted(incident_id=result.incident_id, state=state, message=result.message)


@router.post("/diagnose", response_model=DiagnoseResult)
async def diagnose(handle: Supervisor, by: Requester, body: Annotated[DiagnoseRequest | None, Body()] = None) -> Any:
    """Capture evidence now; answers when the bundle is written."""
    req = body or DiagnoseRequest()
    result, refused = await _submit(handle, Command(kind="diagnose", native=req.native, gdb=req.gdb, requested_by=by))
    if refused is not None:
        return refused
    hung = (result.summary or {}).get("trigger") == "hung"
    state = result.state or handle.snapshot().state
    message = result.message
    if not hung:
        message += f"; the server is not hung (state {state}): the stacks show where its threads wait, no hang class"
    return DiagnoseResult(bundle_id=result.bundle_id, summary=result.summary, message=message, state=state, hung=hung)


@router.post("/stop", status_code=202, response_model=CommandAccepted)
async def stop(handle: Supervisor, by: Requester, body: Annotated[StopRequest | None, Body()] = None) -> Any:
    """Stop the server tree and stay stopped until `POST /start`; already stopped is a 202 too."""
    return await _accepted(handle, Command(kind="stop", reason=(body or StopRequest()).reason, requested_by=by))


@router.post("/start", status_code=202, response_model=CommandAccepted, responses=NO_RUNG)
async def start(handle: Supervisor, by: Requester, body: Annotated[StartRequest | None, Body()] = None) -> Any:
    """Start the server after a stop, or out of `failed`."""
    rung = (body or StartRequest()).rung
    ladder = handle.snapshot().ladder
    if rung is not None and ladder and rung not in ladder:
        return unknown_rung(rung, ladder)
    return await _accepted(handle, Command(kind="start", rung=rung, requested_by=by))


@router.post("/reload", response_model=CommandAccepted)
async def reload(handle: Supervisor, by: Requester) -> Any:
    """Re-read the config file, as SIGHUP does; a config that does not validate is a 400 and the old one stays."""
    return await _accepted(handle, Command(kind="reload", source="api", requested_by=by))


@router.post("/promote", status_code=202, response_model=RestartAccepted)
async def promote(handle: Supervisor, by: Requester, body: Annotated[PromoteRequest | None, Body()] = None) -> Any:
    """Try the preferred rung (rung 0) now: a manual restart onto it, which never counts against the
    rung the server is on; 409 when the server already serves on it, or when it is stopped (a
    promotion never undoes a stop: `start --rung <preferred>` does)."""
    snap = handle.snapshot()
    refused = promote_rule.refusal(snap)
    if refused is not None:
        return error_response(refused.status, refused.error, refused.message, state=snap.state)
    preferred = snap.ladder[0]
    why = (body or PromoteRequest()).reason or f"promote: try the preferred rung {preferred} now"
    command = Command(kind="restart", rung=preferred, reason=why, requested_by=by)
    result, refusal_ = await _submit(handle, command)
    if refusal_ is not None:
        return refusal_
    state = result.state or snap.state
    return RestartAccepted(incident_id=result.incident_id, state=state, message=promote_rule.accepted_message(snap))
