"""Evidence before anything is killed: py-spy and gdb of every process, /proc, NVML, one bundle.

The daemon calls `capture` on a hung verdict or a `POST /diagnose` and `self_check` at start; the
API reads finished bundles through its one descriptor-safe reader, `api.bundles`.
"""

from __future__ import annotations

from supervisor.diagnostics.capture import capture
from supervisor.diagnostics.classify import classify
from supervisor.diagnostics.records import (
    BundleResult,
    CaptureRequest,
    Classification,
    Evidence,
    Frame,
    HangClass,
    ProcEvidence,
    StackThread,
    ToolOutcome,
    new_incident_id,
)
from supervisor.diagnostics.redact import Redactor
from supervisor.diagnostics.selfcheck import self_check

__all__ = [
    "BundleResult",
    "CaptureRequest",
    "Classification",
    "Evidence",
    "Frame",
    "HangClass",
    "ProcEvidence",
    "Redactor",
    "StackThread",
    "ToolOutcome",
    "capture",
    "classify",
    "new_incident_id",
    "self_check",
]
