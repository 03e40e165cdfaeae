"""Request and response bodies of the REST API (the `/status` body is `supervisor.status.snapshot`).

Requests are strict: unknown fields, wrong types and strings where booleans belong are 422s,
so a typo in a script fails loudly instead of being ignored.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class RestartRequest(_Request):
    rung: str | None = Field(
        default=None, min_length=1, max_length=128, description="go straight to this rung of the ladder"
    )
    reason: str = Field(default="", max_length=1000, description="recorded in the incident and journal")
    diagnose: bool = Field(default=False, description="capture evidence before stopping the tree")


class DiagnoseRequest(_Request):
    native: bool | None = Field(default=None, description="py-spy --native (default: the configured one)")
    gdb: bool | None = Field(default=None, description="also run a gdb batch backtrace, even when healthy")


class StopRequest(_Request):
    reason: str = Field(default="", max_length=1000, description="recorded in the journal and the state's reason")


class PromoteRequest(_Request):
    reason: str = Field(default="", max_length=1000, description="recorded in the incident and journal")


class StartRequest(_Request):
    rung: str | None = Field(
        default=None,
        min_length=1,
        max_length=128,
        description="start on this rung (default: the current one; out of failed the preferred one)",
    )


class RestartAccepted(BaseModel):
    incident_id: str | None
    state: str
    message: str = ""


class CommandAccepted(BaseModel):
    state: str
    message: str = ""


class DiagnoseResult(BaseModel):
    bundle_id: str | None
    summary: dict[str, Any] | None = None
    message: str = ""
    state: str | None = Field(default=None, description="the supervisor's state when the capture ended")
    hung: bool = Field(default=False, description="captured as a hang; false: summary.hang_class is no verdict")


class ErrorBody(BaseModel):
    error: str = Field(description="a stable code: unauthorized, not_found, invalid, conflict, busy, ...")
    detail: Any = Field(default=None, description="what went wrong, in words or as a list of field errors")
    state: str | None = Field(default=None, description="the supervisor's state, where it explains the error")
    rungs: list[str] | None = Field(default=None, description="the ladder's rungs, for an unknown rung")
    events: list[str] | None = Field(default=None, description="the known event names, for an unknown one")


class BundleInfo(BaseModel):
    id: str
    summary: dict[str, Any] | None = None


class BundleList(BaseModel):
    bundles: list[BundleInfo]


class BundleDetail(BaseModel):
    id: str
    summary: dict[str, Any] | None = None
    files: list[str]


class EventList(BaseModel):
    events: list[dict[str, Any]]


class Liveness(BaseModel):
    ok: bool
    loop_heartbeat_age_s: float | None = None
    detail: str = ""


class Readiness(BaseModel):
    ready: bool
    state: str
