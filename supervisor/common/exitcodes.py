"""Every exit status the `sglang-supervisor` command gives, in one place (docs/OPERATIONS.md lists
them for scripts; the systemd unit and the LeaderWorkerSet manifest depend on 3, 75 and 76).

The daemon (`run`) and the client verbs are different programs to their callers, so a number may
mean one thing for each: 3 is "the state directory is locked" for `run`, "unreachable" for a verb.
"""

from __future__ import annotations

# The daemon, `sglang-supervisor run`.
EXIT_CONFIG = 2  # the config, the token or the state directory refused at start
EXIT_LOCKED = 3  # another daemon holds the state directory (the unit does not restart on it)
EXIT_HANDOFF = 75  # EX_TEMPFAIL, "run me again": the SIGUSR2 re-exec failed (RestartForceExitStatus=75)
# [group] restart = "lws": the leader exits so after writing the group's evidence, and LeaderWorkerSet
# (RecreateGroupOnPodRestart) recreates every pod of the group; not 0, 2, 3 or 75, so it means only this.
EXIT_GROUP_RESTART = 76

# The client verbs: 1-4 keep their meaning for every verb; `status` exits by state (5-10).
EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_UNREACHABLE, EXIT_AUTH = 0, 1, 2, 3, 4
EXIT_DEGRADED = 5  # serving, but health failing below the threshold or speculation under its floor
EXIT_STARTING = 6  # launched, not yet ready (loading, capturing graphs, warming up)
EXIT_RECOVERING = 7  # hung, diagnosing or restarting: an incident is being handled
EXIT_STOPPED = 8  # stopped by request
EXIT_FAILED = 9  # the ladder or the restart budget is exhausted
EXIT_FALLBACK = 10  # ready, but on a fallback rung: the preferred configuration failed (`promote` retries it)
EXIT_TIMEOUT = 124  # --wait ran out of time (as timeout(1) does)
# The reader of stdout went away (`sglang-supervisor events | head`): 128 + SIGPIPE, what a shell
# reports for a program the signal ended (`yes | head`), said without a traceback.
EXIT_BROKEN_PIPE = 141
