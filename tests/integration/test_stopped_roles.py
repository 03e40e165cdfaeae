"""A stopped process is the culprit, whatever its role, and judged at once (issue 51), through the
running daemon on the simulator's real process tree at tp 2.

One daemon, one rung per role: the server's main process (the HTTP front end and tokenizer manager),
scheduler TP0, the detokenizer, and TP1 (one rank of several) are each SIGSTOPped in turn once the
rung serves. For each: the incident is `unhealthy`, judged at the poll that saw the FIRST failed health
check (the verdict's `health_failures` figure is 1, with the test windows' `health_failures` at 2), its
reason names the stopped process, and line 1 of the bundle's summary.txt names the stopped process,
not an idle rank or the front end's loop. On today's code before issue 51 the front end's bundle named
a rank on line 1, and every verdict waited for the second failed health check."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from simconfig import QUICK_RESTART

from supervisor.config.settings import BASE_RUNG

pytestmark = pytest.mark.integration

# (rung, which process to stop, the head of line 1 of summary.txt, the name in the verdict's reason)
ROLES = [
    (
        BASE_RUNG,
        "main",
        "Culprit: front end (main) pid {pid} thread ",
        "the server's main process (HTTP front end) pid {pid}",
    ),
    ("sched", "TP0", "Culprit: scheduler TP0 pid {pid} thread ", "scheduler TP0 pid {pid}"),
    ("detok", "detokenizer", "Culprit: detokenizer pid {pid} thread ", "detokenizer pid {pid}"),
    ("rank", "TP1", "Culprit: scheduler TP1 pid {pid} thread ", "scheduler TP1 pid {pid}"),
]


def pick(snap: Any, which: str) -> int:
    for p in snap.processes:
        if which == "main" and p.role == "main":
            return int(p.pid)
        if which == "detokenizer" and p.role == "detokenizer":
            return int(p.pid)
        if which.startswith("TP") and p.role == "scheduler" and p.rank == int(which[2:]):
            return int(p.pid)
    raise AssertionError(f"no {which} in {snap.processes}")


@pytest.mark.timeout(420)
async def test_each_role_stopped_is_named_first_and_judged_at_the_first_failed_health_check(daemon, sim) -> None:  # type: ignore[no-untyped-def]
    # Each rung answers `unhealthy` (`on`), so every served rung's stopped process steps down to the next
    # role's rung (issue 49: a fault after serving that no rung answers is relaunched on the same rung).
    ok = {"env": {"SGLANG_SIM_SCENARIO": "ok"}, "on": ["unhealthy"]}
    rest = [{"name": name, **ok} for name, *_ in ROLES[1:]]
    s = sim("ok", tp=2, fallback=[*rest, {"name": "ok", **ok}], restart=QUICK_RESTART)
    r = await daemon(s)
    state_dir = Path(r.settings.paths.state_dir)
    seen: set[str] = set()
    for rung, which, head, named in ROLES:
        snap = await r.wait_for(
            lambda x, rung=rung: x.rung == rung and x.state == "ready" and x.serving.health_ok is True,
            120,
            f"rung {rung} serves",
        )
        pid = pick(snap, which)
        os.kill(pid, signal.SIGSTOP)
        stopped_at = time.monotonic()
        snap = await r.wait_for(
            lambda x, rung=rung: x.last_incident is not None
            and x.last_incident.rung == rung
            and x.last_incident.id not in seen
            and x.last_incident.culprit is not None,
            120,
            f"the incident of the stopped {which}, with its bundle",
        )
        took = time.monotonic() - stopped_at
        inc = snap.last_incident
        seen.add(inc.id)
        assert inc.cause == "unhealthy", (which, inc)
        # Whatever the other processes do (the ranks turn their loops with nothing to take), the stop is the hang.
        assert inc.hang_class == "idle_deadlock", (which, inc)
        assert named.format(pid=pid) in inc.detail and "(state T" in inc.detail, (which, inc.detail)
        bundle = state_dir / "diagnostics" / inc.bundle
        verdict = json.loads((bundle / "verdict.json").read_text())
        figures = verdict["figures"]
        # Judged at the poll that saw the first failed health check, not after `health_failures` (2).
        assert figures["health_failures"] == 1 and figures["stopped_pid"] == pid, (which, figures)
        text = (bundle / "summary.txt").read_text()
        first = text.splitlines()[0]
        assert first.startswith(head.format(pid=pid)) and "is stopped (state T" in first, (which, text[:2000])
        assert inc.culprit == first
        doc = json.loads((bundle / "summary.json").read_text())
        assert doc["culprit"]["pid"] == pid and doc["culprit"]["standing"] == "stopped", doc["culprit"]
        assert text.splitlines()[1] == "  because the process is stopped by a signal: it runs no code", text[:800]
        # A stop the daemon cannot miss: health timeout plus a health interval plus slack for a loaded host.
        assert took < 60, (which, took)
