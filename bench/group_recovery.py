"""The group recovers as one (issue 54): the six cases of the issue, each run as described, with the
count of incidents, launches and ladder steps against the ideal, as bench.outage's fault script does
for one node.

One real daemon per simulated node on loopback (bench.multinode's `group_daemons`), each with its own
state directory, API port and simulator; every figure is read from each daemon's own journal and
`/status`. The cases:
  hang_every_node   both nodes' `base` deadlocks after the load (`no-cuda-graph` fixes it), one retry per
                    rung: ideal 2 incidents (the retry, then the step down), never "a node was away"
  late_third_node   three nodes, node 2 starts 35 s after the others, absent_wait_s 20, no retries: the
                    present member's stall is held for node 2 and named; ideal 0 ladder steps, `base` kept
  twin_node_rank    a second daemon claiming node_rank 1 during a group relaunch: ideal 0 launches by it,
                    refused naming both daemons
  partition_long    node 1 (daemon and ranks) frozen 25 s under load, absent_wait_s 12: ideal 1
                    incident naming node 1, relaunched on its rung, 0 ladder steps, the stale server replaced
  partition_short   the same for 15 s with absent_wait_s 45: ideal 0 incidents, 0 relaunches
  readyz_truth      node 1 frozen, node 0 holding its incident for it: node 0's `/readyz` 503 throughout
  member_crash_loop node 1 crashes at every load, two rungs: ideal every incident names node 1, `failed`

    .venv/bin/python -m bench.group_recovery --reps 3          # every case, writes the section
    .venv/bin/python -m bench.group_recovery --only partition_long --reps 10 --no-write
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench.common import Daemon, Traffic, free_port, header, load_result, publish, save_result, workdir
from bench.multinode import group_daemons, group_ready
from bench.report import table
from supervisor.policy.recovery import GROUP_SAME_RUNG

NCG = [{"name": "no-cuda-graph", "args": {"disable-cuda-graph": True}}]
SECOND = [{"name": "second", "args": {"disable-cuda-graph": True}}]


@dataclass
class Run:
    case: str
    incidents: int = 0
    launches: list[int] = field(default_factory=list)  # server_launched per node
    steps: int = 0  # ladder decisions the ladder judged (not forced on the rung by the group)
    forced: int = 0  # relaunches forced on the rung by the group
    named: str = ""  # what the verdicts named
    end: str = ""  # the leader's state and rung at the end
    figure: str = ""  # the case's own figure
    error: str = ""


IDEAL = {
    "hang_every_node": "<= 2 incidents, 0 forced, ends on no-cuda-graph",
    "late_third_node": "0 ladder steps, incidents name node 2, ends on base",
    "twin_node_rank": "the twin refused, launches 0",
    "partition_long": "0 ladder steps; every relaunch forced on the rung naming node 1, the first 'partitioned'; "
    "its stale server replaced",
    "partition_short": "0 incidents, 0 relaunches",
    "readyz_truth": "/readyz 503 in every sample of the wait",
    "member_crash_loop": "every incident names node 1, ends failed",
}
CASES = tuple(IDEAL)


def _frozen(d: Daemon) -> list[int]:
    st = d.status()
    assert st is not None
    return [int(p["pid"]) for p in st["processes"] if p["role"] == "scheduler"]


def _freeze(d: Daemon, pids: list[int], sig: signal.Signals) -> None:
    assert d.proc is not None
    if sig == signal.SIGSTOP:
        d.proc.send_signal(sig)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
    if sig == signal.SIGCONT:
        d.proc.send_signal(sig)


def _decisions(d: Daemon) -> list[dict[str, Any]]:
    return [e for e in d.events() if e.get("event") == "ladder_decision"]


def _count(run: Run, nodes: list[Daemon]) -> None:
    leader = nodes[0]
    ev = leader.events()
    run.incidents = sum(1 for e in ev if e.get("event") == "incident")
    run.launches = [sum(1 for e in d.events() if e.get("event") == "server_launched") for d in nodes]
    ds = _decisions(leader)
    run.forced = sum(1 for d in ds if str(d.get("reason", "")).startswith(GROUP_SAME_RUNG))
    run.steps = sum(1 for d in ds if not str(d.get("reason", "")).startswith((GROUP_SAME_RUNG, "manual restart")))
    st = leader.status()
    run.end = f"{st['state']} on {st['rung']}" if st else "no answer"
    details = [str(e.get("detail", "")) for e in ev if e.get("event") == "incident"]
    run.named = "; ".join(sorted({d[: d.find(":")] if d.startswith("node ") else d[:40] for d in details}))[:120]


def case_hang_every_node(wd: Path, run: Run) -> list[Daemon]:
    unless = {"SGLANG_SIM_UNLESS": "disable-cuda-graph"}
    nodes = group_daemons(
        wd, scenarios={0: "deadlock_after_load", 1: "deadlock_after_load"}, env={0: unless, 1: unless},
        fallback=NCG, restart={"retries_per_rung": 1}, absent_wait_s=6.0,
    )  # fmt: skip
    for d in nodes:
        d.start()
    nodes[0].wait(lambda s: s["rung"] == "no-cuda-graph" and group_ready(s), 240, "the group ready on the fallback")
    _count(run, nodes)
    if run.incidents > 2 or run.forced:
        run.error = f"{run.incidents} incidents, {run.forced} forced: {[d['reason'] for d in _decisions(nodes[0])]}"
    run.figure = f"{run.incidents} incidents to the fixing rung"
    return nodes


def case_late_third_node(wd: Path, run: Run) -> list[Daemon]:
    nodes = group_daemons(wd, 3, absent_wait_s=20.0, fallback=SECOND, restart={"retries_per_rung": 0}, tp=3)
    nodes[0].start()
    nodes[1].start()
    time.sleep(35)
    nodes[2].start()
    nodes[0].wait(group_ready, 180, "the group of three ready")
    _count(run, nodes)
    waits = [e for e in nodes[0].events() if e.get("event") == "group_waiting"]
    wrong = [e for e in nodes[0].events() if e.get("event") == "incident" and "node 2" not in str(e.get("detail"))]
    if run.steps or not run.end.endswith("base") or wrong or not waits or any(w.get("node") != 2 for w in waits):
        run.error = f"steps {run.steps}, end {run.end}, waits {[w.get('node') for w in waits]}, misnamed {len(wrong)}"
    run.figure = f"group_waiting named node {sorted({int(w.get('node', -1)) for w in waits})}"
    return nodes


def case_twin_node_rank(wd: Path, run: Run) -> list[Daemon]:
    nodes = group_daemons(wd, restart={"retries_per_rung": 1})
    for d in nodes:
        d.start()
    leader, worker = nodes
    leader.wait(group_ready, 90, "the group ready")
    data = worker.settings.model_dump()  # the same config, its own ports and state directory
    data["api"]["port"], data["server"]["port"] = free_port(), free_port()
    data["paths"]["state_dir"] = str(wd / "twin" / "state")
    (wd / "twin").mkdir()
    twin = Daemon(type(worker.settings).model_validate(data), wd / "twin")
    nodes.append(twin.start())
    deadline = time.time() + 60
    while time.time() < deadline and not [e for e in twin.events() if e.get("event") == "group_launch_held"]:
        time.sleep(0.5)
    old = leader.status()["pid"]  # type: ignore[index]
    httpx.post(f"{leader.api}/restart", json={"reason": "bench"}, headers=_auth(leader), timeout=10, trust_env=False)
    leader.wait(lambda s: s["pid"] != old and group_ready(s), 120, "the group relaunched and ready")
    time.sleep(3)
    _count(run, nodes[:2])
    launched = sum(1 for e in twin.events() if e.get("event") == "server_launched")
    refused = [e for e in leader.events() if e.get("event") == "group_join_refused"]
    run.figure = f"twin launches {launched}, refusals {len(refused)}"
    if launched or not refused:
        run.error = run.figure
    return nodes


def _auth(d: Daemon) -> dict[str, str]:
    token_file = d.settings.api.token_file
    if token_file is None or not Path(token_file).exists():
        return {}
    return {"Authorization": f"Bearer {Path(token_file).read_text().strip()}"}


def _partition(wd: Path, run: Run, hold_s: float, wait_s: float) -> list[Daemon]:
    nodes = group_daemons(wd, absent_wait_s=wait_s, fallback=SECOND, restart={"retries_per_rung": 0})
    for d in nodes:
        d.start()
    leader, worker = nodes
    leader.wait(group_ready, 90, "the group ready")
    old_pid = worker.status()["pid"]  # type: ignore[index]
    pids = _frozen(worker)
    with Traffic(leader.settings.server.port, concurrency=2, seconds=hold_s + 120, tokens=400):
        time.sleep(1.0)
        _freeze(worker, pids, signal.SIGSTOP)
        time.sleep(hold_s)
        _freeze(worker, pids, signal.SIGCONT)
        st = leader.wait(lambda s: group_ready(s) and s["group"]["status"] == "ok", 180, "the group whole again")
    time.sleep(2)
    _count(run, nodes)
    new_pid = worker.status()["pid"]  # type: ignore[index]
    replaced = new_pid != old_pid
    run.figure = f"node 1's server {'replaced' if replaced else 'kept'}; ended {st['state']}"
    if hold_s > wait_s:
        why = [d["reason"] for d in _decisions(leader)]
        # The first relaunch names the partition; node 0's new server may stall at the rendezvous
        # before node 1, back, is relaunched: a second relaunch on the rung, naming node 1 late.
        named = bool(why) and "node 1 was partitioned" in why[0] and all(": node 1 was " in w for w in why)
        if run.steps or not run.incidents or not replaced or not named:
            run.error = f"steps {run.steps}, incidents {run.incidents}, replaced {replaced}, decisions {why}"[:300]
    elif run.incidents or run.steps or run.forced or replaced:
        run.error = f"incidents {run.incidents}, steps {run.steps}, forced {run.forced}, replaced {replaced}"
    return nodes


def case_partition_long(wd: Path, run: Run) -> list[Daemon]:
    return _partition(wd, run, 25.0, 12.0)


def case_partition_short(wd: Path, run: Run) -> list[Daemon]:
    return _partition(wd, run, 15.0, 45.0)


def case_readyz_truth(wd: Path, run: Run) -> list[Daemon]:
    nodes = group_daemons(wd, absent_wait_s=45.0, restart={"retries_per_rung": 1})
    for d in nodes:
        d.start()
    leader, worker = nodes
    leader.wait(group_ready, 90, "the group ready")
    pids = _frozen(worker)
    answers: list[int] = []
    with Traffic(leader.settings.server.port, concurrency=2, seconds=120, tokens=400):
        time.sleep(1.0)
        _freeze(worker, pids, signal.SIGSTOP)
        try:
            leader.wait(lambda s: "waiting for node 1" in s["reason"], 60, "node 0 holding its incident for node 1")
            for _ in range(10):
                r = httpx.get(f"{leader.api}/readyz", timeout=5, trust_env=False)
                answers.append(r.status_code)
                time.sleep(0.5)
        finally:
            _freeze(worker, pids, signal.SIGCONT)
        leader.wait(group_ready, 150, "the group ready again")
    _count(run, nodes)
    run.figure = f"/readyz {answers.count(503)}/{len(answers)} answered 503"
    if answers.count(503) != len(answers):
        run.error = run.figure
    return nodes


def case_member_crash_loop(wd: Path, run: Run) -> list[Daemon]:
    nodes = group_daemons(wd, scenarios={1: "crash_on_load"}, fallback=SECOND, restart={"retries_per_rung": 1})
    for d in nodes:
        d.start()
    nodes[0].wait(lambda s: s["state"] == "failed", 240, "the group failed after the ladder")
    _count(run, nodes)
    details = [str(e.get("detail")) for e in nodes[0].events() if e.get("event") == "incident"]
    wrong = [d for d in details if not d.startswith("node 1:")]
    run.figure = f"{len(details) - len(wrong)}/{len(details)} incidents name node 1"
    if wrong or not details:
        run.error = f"{run.figure}: {wrong[:2]}"
    return nodes


RUNNERS: dict[str, Callable[[Path, Run], list[Daemon]]] = {
    "hang_every_node": case_hang_every_node,
    "late_third_node": case_late_third_node,
    "twin_node_rank": case_twin_node_rank,
    "partition_long": case_partition_long,
    "partition_short": case_partition_short,
    "readyz_truth": case_readyz_truth,
    "member_crash_loop": case_member_crash_loop,
}


def run_case(case: str) -> Run:
    wd = workdir(f"group-{case}")
    run = Run(case)
    nodes: list[Daemon] = []
    try:
        nodes = RUNNERS[case](wd, run)
    except Exception as err:  # a row says what went wrong instead of ending the table
        run.error = run.error or repr(err)[:300]
    finally:
        for d in reversed(nodes or []):
            if d.proc is not None:
                d.proc.send_signal(signal.SIGCONT)
            d.stop()
    return run


def render(runs: list[Run]) -> str:
    rows = []
    for case in CASES:
        rs = [r for r in runs if r.case == case]
        if not rs:
            continue
        ok = [r for r in rs if not r.error]

        def spread(xs: list[int]) -> str:
            return f"{min(xs)}-{max(xs)}" if xs and min(xs) != max(xs) else (str(xs[0]) if xs else "-")

        rows.append([
            case,
            f"{len(ok)}/{len(rs)}",
            spread([r.incidents for r in rs]),
            spread([sum(r.launches) for r in rs]),
            spread([r.steps for r in rs]),
            spread([r.forced for r in rs]),
            rs[-1].figure or "-",
            IDEAL[case],
        ])  # fmt: skip
    head = ["case", "runs ok", "incidents", "launches (all nodes)", "ladder steps", "forced on the rung",
            "figure (last run)", "ideal"]  # fmt: skip
    intro = header(
        "Group recovery",
        "group_recovery",
        "Issue 54's cases, one real daemon per simulated node on loopback (tp 2, or 3 for three nodes), "
        "poll 0.5 s, stall windows 4 s, `request_timeout_s` 1 s, `unreachable_s` 2 s. Counts are ranges "
        "over the runs (from each daemon's own journal); a run passes when it meets the ideal.",
    ).replace("bench.run_all --only group_recovery", "bench.group_recovery")
    errors = [f"- {r.case}: {r.error}" for r in runs if r.error]
    body = [intro, "", table(head, rows), ""]
    if errors:
        body += ["Runs that missed the ideal:", *errors, ""]
    return "\n".join(body)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--reps", type=int, default=1, help="runs per case")
    p.add_argument("--only", choices=CASES, action="append", help="only these cases (repeatable)")
    p.add_argument("--no-write", action="store_true", help="print the table, leave docs/BENCHMARKS.md alone")
    p.add_argument("--add", action="store_true", help="count these runs with the saved ones (ten runs in parts)")
    args = p.parse_args(argv)
    cases = tuple(args.only or CASES)
    runs = [run_case(c) for c in cases for _ in range(args.reps)]
    for r in runs:
        print(f"{r.case}: {'ok' if not r.error else 'MISSED ' + r.error} ({r.figure})", flush=True)
    if (args.only or args.add) and not args.no_write:
        saved = [Run(**r) for r in load_result("group_recovery") or []]
        kept = [r for r in saved if args.add or r.case not in cases]
        runs = sorted(kept + runs, key=lambda r: CASES.index(r.case))
    if not args.no_write:
        save_result("group_recovery", [r.__dict__ for r in runs])
    body = render(runs)
    if args.no_write:
        print(body)
    else:
        publish("group_recovery", body)
    return 0 if not any(r.error for r in runs) else 1


if __name__ == "__main__":
    raise SystemExit(main())
