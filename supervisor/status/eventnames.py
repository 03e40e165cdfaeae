"""Every event name the daemon writes to its journal, typed once, so `GET /events?event=` can refuse a
typo and mypy refuses a write of a name not listed here.

A filter on a name the daemon never writes matches nothing and looks like "no events": an
operator who typed `incidents` for `incident` would conclude that nothing happened. The API
answers such a name with a 422 that lists these. `Journal.append` and the owner's `record` take an
`EventName`, so a name missing here fails the type check; tests/supervisor/status/test_eventnames.py
checks the other way (every name listed is written somewhere).
"""

from __future__ import annotations

from typing import Literal, cast, get_args

EventName = Literal[
    "adoption_refused",
    "bundle_write_failed",
    "bundle_written",
    "clean_slate",
    "command",
    "config_reload_refused",
    "config_reloaded",
    "containment",
    "daemon_handoff",
    "daemon_started",
    "decision_resumed",
    "diagnostics_failed",
    "failed_cooldown",
    "failed_cooldown_over",
    "failed_left",
    "fr_trace",
    "gpu_blocked",
    "gpu_scope",
    "gpu_unblocked",
    "gpu_xid",
    "group_degraded",
    "group_evidence",
    "group_exit",
    "group_incident",
    "group_join",
    "group_join_refused",
    "group_launch",
    "group_launch_held",
    "group_mismatch",
    "group_node_absent",
    "group_waiting",
    "group_member_incident",
    "group_recovered",
    "group_started",
    "group_stop",
    "handoff_inherited",
    "handoff_refused",
    "incident",
    "kernel_cache",
    "ladder_decision",
    "launch_blocked",
    "launch_refused",
    "launch_timeline",
    "leftovers_stopped",
    "log_keeper_lost",
    "log_keeper_replaced",
    "log_keeper_stopped",
    "loop_error",
    "notification",
    "outage",
    "page_login",
    "page_login_refused",
    "page_logout",
    "promotion",
    "server_adopted",
    "server_launched",
    "server_ready",
    "server_stable",
    "server_stopped",
    "spawn_failed",
    "spec_regression",
    "state_changed",
    "state_save_failed",
    "stayed_stopped",
    "weights_residency",
    "xid_watch",
    # issue 50: a launches.json entry dropped for a number that is not one is said where /events shows it
    "launch_book_unreadable",
]

EVENT_NAMES: frozenset[str] = frozenset(get_args(EventName))

# Names the owner writes as log lines only (`record(..., only="log")`): never a journal event.
LogEventName = Literal[
    "bundle",
    "incident_interrupted",
    "launch_book_unwritable",
    "observation_unknown",
    "selfcheck",
    "shutdown_stop_failed",
    "state_loaded",
]
AnyEventName = EventName | LogEventName


def journal_name(name: AnyEventName) -> EventName:
    """`name` as a journal event; a log-only name sent to the journal is a programming error."""
    if name not in EVENT_NAMES:
        raise ValueError(f"{name!r} is a log line only, never a journal event")
    return cast(EventName, name)


def unknown_events(names: frozenset[str] | set[str]) -> list[str]:
    return sorted(n for n in names if n not in EVENT_NAMES)
