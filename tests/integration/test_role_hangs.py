"""A hang in each role is named on line 1 with why (issue 51), through the running daemon on the
simulator's real process tree: py-spy reads every process of the tree as it would read SGLang's.

One daemon, one rung per role, each hang beginning a while after the rung serves and printing
nothing: the server's main process whose event loop is stuck in a callback (`frontend_hang`: no
request is read, /health times out), the detokenizer blocked on its tokenizer's lock
(`detokenizer_hang`: the schedulers finish and idle, no output reaches a client), scheduler TP0
blocked in its forward (`health_hangs`, at tp 2), and at tp 3 the last rank skipping a forward's
all-reduce while TP0 and TP1 wait in it (`collective_skipped`, SGLang #33289). For each: the incident
is `unhealthy`, and line 1 of the bundle's summary.txt (and /status's `last_incident.culprit`) names
that process, with its short why. Before issue 51's ranking, line 1 named an idle rank for the front
end, the detokenizer and the skipped rank alike (a non-rank process was named only when stopped, and
the skipped rank only through the collective rule's "never joined")."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from simconfig import QUICK_RESTART

from supervisor.config.settings import BASE_RUNG
from supervisor.diagnostics.tools import find_py_spy

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(find_py_spy() is None, reason="py-spy is not installed: no stack, no culprit"),
]

# (rung, scenario, tp, whose process, line 1's head, the short why that line 1 carries, its standing)
ROLES = [
    (
        BASE_RUNG,
        "frontend_hang",
        2,
        "main",
        "Culprit: front end (main) pid {pid} thread 'MainThread' tid {pid} ",
        "; event loop blocked in TokenizerManager.wait_for_model_update",
        "blocked",
    ),
    (
        "detok",
        "detokenizer_hang",
        2,
        "detokenizer",
        "Culprit: detokenizer pid {pid} thread 'MainThread' tid {pid} ",
        "; holds the requests: blocked in Detokenizer.batch_decode",
        "blocked",
    ),
    (
        "sched",
        "health_hangs",
        2,
        "TP0",
        "Culprit: scheduler TP0 pid {pid} thread 'MainThread' tid {pid} ",
        "",
        "blocked",
    ),
    (
        "rank",
        "collective_skipped",
        3,
        "TP2",
        "Culprit: scheduler TP2 pid {pid} thread 'MainThread' tid {pid} ",
        "; idle while ranks 0-1 wait in all_reduce: skipped the collective",
        "halted",
    ),
]


def pick(snap: Any, which: str) -> int:
    for p in snap.processes:
        if which in ("main", "detokenizer") and p.role == which:
            return int(p.pid)
        if which.startswith("TP") and p.role == "scheduler" and p.rank == int(which[2:]):
            return int(p.pid)
    raise AssertionError(f"no {which} in {snap.processes}")


def rung(name: str, scenario: str, tp: int) -> dict[str, Any]:
    return {"name": name, "env": {"SGLANG_SIM_SCENARIO": scenario}, "args": {"tp-size": tp}, "on": ["unhealthy"]}


@pytest.mark.timeout(600)
async def test_each_roles_hang_is_named_on_line_1_with_why(daemon, sim) -> None:  # type: ignore[no-untyped-def]
    rest = [rung(name, scenario, tp) for name, scenario, tp, *_ in ROLES[1:]]
    s = sim(ROLES[0][1], tp=ROLES[0][2], fallback=[*rest, rung("ok", "ok", 2)], restart=QUICK_RESTART)
    r = await daemon(s)
    state_dir = Path(r.settings.paths.state_dir)
    seen: set[str] = set()
    for name, scenario, tp, which, head, why, standing in ROLES:
        snap = await r.wait_for(
            lambda x, name=name, tp=tp: (
                x.rung == name
                and x.state == "ready"
                and x.serving.health_ok is True
                and sum(p.role == "scheduler" for p in x.processes) == tp
            ),
            180,
            f"rung {name} serves",
        )
        pid = pick(snap, which)
        snap = await r.wait_for(
            lambda x, name=name: (
                x.last_incident is not None
                and x.last_incident.rung == name
                and x.last_incident.id not in seen
                and x.last_incident.culprit is not None
            ),
            180,
            f"the incident of {scenario}, with its bundle",
        )
        inc = snap.last_incident
        seen.add(inc.id)
        assert inc.cause == "unhealthy", (scenario, inc)
        bundle = state_dir / "diagnostics" / inc.bundle
        text = (bundle / "summary.txt").read_text()
        first = text.splitlines()[0]
        print("\n".join(text.splitlines()[:6]), flush=True)
        assert first.startswith(head.format(pid=pid)), (scenario, text[:3000])
        if why:
            assert why in first, (scenario, first)
        assert inc.culprit == first
        doc = json.loads((bundle / "summary.json").read_text())
        assert doc["culprit"]["pid"] == pid and doc["culprit"]["standing"] == standing, (scenario, doc["culprit"])
        assert doc["culprit"]["why"] == (why.removeprefix("; ") or None), (scenario, doc["culprit"])
