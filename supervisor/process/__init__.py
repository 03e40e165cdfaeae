"""The one package that starts processes and sends signals.

The server runs in a session of its own (SGLang may killpg its own group and must not take the
daemon with it), with a marker variable that every descendant inherits, so a member that escaped
the group or outlived its parent is still found and stopped. `spawn` starts processes, `signals`
signals single processes, `stop` stops a whole tree and verifies it is gone.
"""

from __future__ import annotations

from probes.ports import port_holders, port_is_free
from probes.proctree import MARKER_ENV, find_tree
from supervisor.process.signals import resume_stopped, send_signal
from supervisor.process.spawn import ChildHandle, ServerProcess, SpawnError, spawn_log_keeper, start_log_keeper
from supervisor.process.stop import StopReport, kill_marked, stop_tree, wait_port

__all__ = [
    "MARKER_ENV",
    "ChildHandle",
    "ServerProcess",
    "SpawnError",
    "StopReport",
    "find_tree",
    "kill_marked",
    "port_holders",
    "port_is_free",
    "resume_stopped",
    "send_signal",
    "spawn_log_keeper",
    "start_log_keeper",
    "stop_tree",
    "wait_port",
]
