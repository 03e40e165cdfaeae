"""Incident causes and hang classes, typed once (DESIGN.md's lists). The tuples are derived from the
`Literal` types, so a name added to one is in the other and mypy checks every use."""

from __future__ import annotations

from typing import Literal, get_args

# Why an incident opened: the watchdog's verdicts, a process that exited, an operator's restart.
Cause = Literal[
    "exited",
    "startup_stall",
    "startup_timeout",
    "unhealthy",
    "serving_stall",
    "rank_died",
    "spec_regression",
    "manual",
]
# The causes that mean the server is hung (not exited, not asked, not merely slow to accept
# drafts): evidence is captured as a hang and the bundle names a hang class.
HungCause = Literal["startup_stall", "startup_timeout", "serving_stall", "unhealthy", "rank_died"]
# What the evidence says a hang is (supervisor.diagnostics.classify).
HangClass = Literal["idle_deadlock", "busy_spin", "collective", "cuda_graph_capture", "io_wait", "unknown"]

CAUSES: tuple[Cause, ...] = get_args(Cause)
HUNG_CAUSES: frozenset[str] = frozenset(get_args(HungCause))
HANG_CLASSES: tuple[HangClass, ...] = get_args(HangClass)
