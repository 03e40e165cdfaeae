"""Evidence before anything is killed: py-spy and gdb of every process, /proc, NVML, one bundle.

The daemon calls `capture` on a hung verdict or a `POST /diagnose` and `self_check` at start; the
API reads finished bundles through its one descriptor-safe reader, `api.bundles`. Benchmarks also use
the tools' finders, command lines and parsers (`find_py_spy`, `gdb_argv`, `parse_cuda_kernels`,
`parse_pystack`, `query_ras`, ...) from here.
"""

from __future__ import annotations

from supervisor.common.redact import Redactor
from supervisor.diagnostics.capture import capture
from supervisor.diagnostics.capturerecords import (
    BundleResult,
    CaptureRequest,
    Classification,
    Evidence,
    Frame,
    ProcEvidence,
    StackThread,
    ToolOutcome,
    new_incident_id,
)
from supervisor.diagnostics.classify import classify
from supervisor.diagnostics.pystack import find_pystack, parse_pystack, pystack_argv
from supervisor.diagnostics.ras import query_ras
from supervisor.diagnostics.selfcheck import self_check
from supervisor.diagnostics.tools import find_gdb, find_py_spy, gdb_argv, parse_cuda_kernels, tool_env

__all__ = [
    "BundleResult",
    "CaptureRequest",
    "Classification",
    "Evidence",
    "Frame",
    "ProcEvidence",
    "Redactor",
    "StackThread",
    "ToolOutcome",
    "capture",
    "classify",
    "find_gdb",
    "find_py_spy",
    "find_pystack",
    "gdb_argv",
    "new_incident_id",
    "parse_cuda_kernels",
    "parse_pystack",
    "pystack_argv",
    "query_ras",
    "self_check",
    "tool_env",
]
