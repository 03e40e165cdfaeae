"""Multi-node groups on the simulator: one real daemon per simulated node, on loopback.

For each fault: the onset (the test's own act, wall clock), the group's verdict (the leader's
`incident` journal event), the group's evidence (`group_evidence`: every member's bundle answered;
plus the leader's own bundle), and the group ready again (the leader's `/status` shows every node
`ready` and `group.serves`), all as seconds after the onset. For the faults that must not be
incidents (a member daemon SIGKILLed and adopted, a member API partitioned, the leader daemon
SIGKILLed) the target is 0 restarts on every node, and the times are to the group's `degraded`
(where it applies) and back to whole. A node lost and back, and the leader daemon SIGKILLed at the
stop or the launch step of a group restart, may relaunch the group but must not step the ladder.

Every trial ends with the same check: every node serves the same rung (each daemon's own /status),
and the leader's ladder stepped only for the servers' own faults (a `ladder_decision` that is not a
relaunch forced on the same rung: only the rank faults and the restart the leader was killed in
may have one). Prints a table and writes docs/BENCHMARKS.md "Multi-node".
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.common import (
    Daemon,
    Traffic,
    header,
    load_result,
    median,
    met,
    parse_ts,
    publish,
    save_result,
    sim_settings,
    workdir,
)
from bench.report import table
from supervisor.config.settings import settings_from_mapping
from supervisor.policy.recovery import GROUP_SAME_RUNG
from supervisor.process import kill_marked

FAULTS = (
    "rank_sigkill",
    "rank_sigstop",
    "never_joins",
    "member_daemon_sigkill",
    "member_partition",
    "leader_daemon_sigkill",
    "worker_late_15s",
    "worker_late_60s",
    "leader_late_15s",
    "leader_late_60s",
    "config_mismatch",
    "node_loss_return",
    "leader_killed_at_stop",
    "leader_killed_at_launch",
)
INCIDENT_FAULTS = FAULTS[:3]
START_FAULTS = ("worker_late_15s", "worker_late_60s", "leader_late_15s", "leader_late_60s")  # must cost no incident
LEADER_KILLED = ("leader_killed_at_stop", "leader_killed_at_launch")
# Faults the servers cause: one ladder decision each (a retry of the rung). The leader killed in the
# restart of such a fault may leave that one decision (made before the kill, or by its successor).
LADDER_FAULTS = ("rank_sigkill", "rank_sigstop", *LEADER_KILLED)
RELAUNCHED = ("node_loss_return", *LEADER_KILLED)  # restarts expected, but no ladder step for the node's loss
AWAY_S = 10.0  # node_loss_return: node 1 (daemon and server) away this long, under absent_wait_s
LOSS_WAIT_S = 30.0
# Relaunches the ladder did not judge: forced on the same rung by the group (GROUP_SAME_RUNG, then
# which node and why) or asked for by hand.
NOT_STEPS = ("rung chosen by request", "manual restart")
FALLBACK = [{"name": "second", "args": {"disable-custom-all-reduce": True}}]  # a step down would show


@dataclass
class Run:
    fault: str
    verdict_s: float | None = None
    evidence_s: float | None = None
    ready_s: float | None = None
    degraded_s: float | None = None
    cause: str = ""
    named: str = ""
    bundles: int = 0  # nodes with a bundle under the incident id
    restarts: list[int] = field(default_factory=list)  # per node, after the run
    rungs: list[str | None] = field(default_factory=list)  # per node at the end (None: no server)
    steps: int = 0  # the leader's ladder decisions that the ladder judged (not forced on the same rung)
    killed_after: str = ""  # leader_killed_*: the last leader event before the kill
    error: str = ""


def group_daemons(
    wd: Path,
    nnodes: int = 2,
    node_args: dict[int, dict[str, Any]] | None = None,
    absent_wait_s: float = 6.0,
    *,
    scenarios: dict[int, str] | None = None,
    env: dict[int, dict[str, str]] | None = None,
    fallback: list[dict[str, Any]] | None = None,
    restart: dict[str, Any] | None = None,
    tp: int = 2,
) -> list[Daemon]:
    """One daemon per node of one group (`scenarios` and `env` per node rank; every node the same
    ladder, `fallback`, and `restart` settings)."""
    from bench.common import free_port

    api = [free_port() for _ in range(nnodes)]
    store = free_port()
    secret = wd / "group-secret"  # the daemons sign to each other ([group] secret_file)
    secret.write_text(os.urandom(24).hex() + "\n")
    secret.chmod(0o600)
    out = []
    for rank in range(nnodes):
        nd = wd / f"node{rank}"
        nd.mkdir(parents=True)
        s = sim_settings(
            nd,
            (scenarios or {}).get(rank, "ok"),
            tp=tp,
            env=(env or {}).get(rank),
            args={
                "model-path": str(wd / "model"),  # one model path, as on shared storage
                "nnodes": nnodes,
                "node-rank": rank,
                "dist-init-addr": f"127.0.0.1:{store}",
                **(node_args or {}).get(rank, {}),
            },
            fallback=FALLBACK if fallback is None else fallback,
            restart={"retries_per_rung": 3} if restart is None else restart,
        )
        data = s.model_dump()
        data["api"]["port"] = api[rank]
        data["group"] = {
            "nnodes": nnodes,
            "node_rank": rank,
            "leader": f"127.0.0.1:{api[0]}",
            "members": [f"127.0.0.1:{p}" for p in api[1:]],
            "request_timeout_s": 1.0,
            "unreachable_s": 2.0,
            "secret_file": str(secret),
            "absent_wait_s": absent_wait_s,  # a node away is waited for 6 s here (production: 600)
            "absent_alert_s": 4.0,
        }
        out.append(Daemon(settings_from_mapping(data), nd))
    return out


def group_ready(st: dict[str, Any]) -> bool:
    g = st.get("group") or {}
    return (
        st["state"] == "ready" and bool(g.get("serves")) and all(n.get("state") == "ready" for n in g.get("nodes", ()))
    )


def _event_s(d: Daemon, name: str, onset: float, **match: object) -> float | None:
    for e in d.events():
        if any(e.get(k) != v for k, v in match.items()):
            continue
        if e.get("event") == name and parse_ts(str(e["ts"])) >= onset - 0.5:
            return round(parse_ts(str(e["ts"])) - onset, 2)
    return None


def _scheduler(d: Daemon) -> int:
    st = d.status()
    assert st is not None
    return int(next(p["pid"] for p in st["processes"] if p["role"] == "scheduler"))


def run_start(fault: str, run: Run, leader: Daemon, worker: Daemon) -> None:
    """A start in some order (no incident may follow), or a member whose config differs."""
    onset = time.time()
    if fault == "config_mismatch":
        leader.start()
        worker.start()
        deadline = time.time() + 60
        while time.time() < deadline:
            held = [e for e in worker.events() if e.get("event") == "group_launch_held" and "tp-size" in e["reason"]]
            if held:
                run.degraded_s = round(parse_ts(str(held[0]["ts"])) - onset, 2)
                run.named = str(held[0]["reason"])[:90]
                run.cause = "refused"
                return
            time.sleep(0.2)
        raise AssertionError("node 1 was not refused")
    late = 60.0 if fault.endswith("60s") else 15.0
    first, second = (leader, worker) if fault.startswith("worker") else (worker, leader)
    first.start()
    time.sleep(late)
    second.start()
    st = leader.wait(group_ready, 120, "the group ready")
    run.ready_s = round(time.time() - onset, 2)
    if st["incidents"]:
        raise AssertionError(f"a false incident: {st['last_incident']}")


def run_fault(fault: str) -> Run:
    wd = workdir(f"multinode-{fault}")
    node_args = {1: {"tp-size": 4}} if fault == "config_mismatch" else None
    # A late start waits for the group: the bound must be above the lateness (production: 600 s);
    # so must a node lost and back (it is away AWAY_S).
    wait = 120.0 if fault in START_FAULTS else LOSS_WAIT_S if fault == "node_loss_return" else 6.0
    leader, worker = group_daemons(wd, node_args=node_args, absent_wait_s=wait)
    run = Run(fault)
    try:
        if fault in START_FAULTS or fault == "config_mismatch":
            run_start(fault, run, leader, worker)
            end_check(fault, run, leader, worker)
            return run

        leader.start()
        if fault != "never_joins":
            worker.start()
            leader.wait(group_ready, 90, "the group ready")
        traffic = Traffic(leader.settings.server.port, concurrency=2, seconds=120, tokens=400)
        with traffic:
            onset = time.time()
            if fault == "rank_sigkill":
                os.kill(_scheduler(worker), signal.SIGKILL)
            elif fault == "rank_sigstop":
                time.sleep(1.0)  # requests running
                onset = time.time()
                os.kill(_scheduler(worker), signal.SIGSTOP)
            elif fault == "never_joins":
                onset = time.time()  # node 0 was launched alone just now
            elif fault == "member_daemon_sigkill":
                assert worker.proc is not None
                worker.proc.send_signal(signal.SIGKILL)
                worker.proc.wait(10)
            elif fault == "member_partition":
                assert worker.proc is not None
                worker.proc.send_signal(signal.SIGSTOP)
            elif fault == "leader_daemon_sigkill":
                kill_daemon(leader)
            elif fault == "node_loss_return":
                marker = worker.marker()
                kill_daemon(worker)  # the node goes: its daemon and its server with it
                assert marker is not None
                kill_marked(marker, grace_s=0.5)
            elif fault in LEADER_KILLED:
                os.kill(_scheduler(worker), signal.SIGKILL)  # a group restart follows
            measure(fault, run, leader, worker, onset)
        end_check(fault, run, leader, worker)
    except Exception as err:  # a benchmark row says what went wrong instead of ending the table
        run.error = run.error or repr(err)[:300]
    finally:
        if worker.proc is not None:
            worker.proc.send_signal(signal.SIGCONT)
        run.restarts = [restarts(d) for d in (leader, worker)]
        run.steps = ladder_steps(leader)
        for d in (worker, leader):
            d.stop()
    return run


def kill_daemon(d: Daemon) -> None:
    assert d.proc is not None
    d.proc.send_signal(signal.SIGKILL)
    d.proc.wait(10)


def restarts(d: Daemon) -> int:
    return sum(1 for e in d.events() if e.get("event") == "server_launched") - 1


def ladder_steps(leader: Daemon) -> int:
    """The leader's ladder decisions that the ladder judged: not a relaunch forced on the same rung
    (a node away or late) nor a manual one."""
    return sum(
        1
        for e in leader.events()
        if e.get("event") == "ladder_decision"
        and e.get("reason") not in NOT_STEPS
        and not str(e.get("reason")).startswith(GROUP_SAME_RUNG)
    )


def end_check(fault: str, run: Run, leader: Daemon, worker: Daemon) -> None:
    """After every trial: every node serves the same rung, read from each daemon's own /status (a
    node that serves nothing fails it too, but in config_mismatch: node 1 is refused and launches
    nothing, so node 0 waits for it at the rendezvous), and the ladder stepped only for the servers'
    own faults."""
    sts = [d.status() for d in (leader, worker)]
    run.rungs = [st["rung"] if st is not None and st.get("pid") is not None else None for st in sts]
    serving = [st is not None and st["state"] in ("ready", "degraded") for st in sts]
    must = [] if fault == "config_mismatch" else serving
    wrong: list[str] = []
    if len({r for r in run.rungs if r is not None}) > 1:
        wrong.append(f"nodes end on different rungs {run.rungs}")
    if not all(must):
        wrong.append(f"not every node serves: {[st['state'] if st else 'no answer' for st in sts]}, rungs {run.rungs}")
    steps = ladder_steps(leader)
    if steps > (1 if fault in LADDER_FAULTS else 0):
        reasons = [e["reason"] for e in leader.events() if e.get("event") == "ladder_decision"]
        wrong.append(f"{steps} ladder step(s) not caused by the servers alone: {reasons}")
    if wrong:
        run.error = "; ".join(wrong)[:300]
        raise AssertionError(run.error)


def measure(fault: str, run: Run, leader: Daemon, worker: Daemon, onset: float) -> None:
    if fault in INCIDENT_FAULTS:
        if fault == "never_joins":
            leader.wait(lambda s: s["incidents"] >= 1, 60, "the start-up stall")
            worker.start()  # node 1's daemon arrives after the verdict
        st = leader.wait(lambda s: s["incidents"] >= 1, 60, "the group verdict")
        inc = st["last_incident"]
        detail = str(inc["detail"])
        at = detail.find("node ")
        run.cause, run.named = inc["cause"], detail[at : at + 90] if at >= 0 else detail[:90]
        run.verdict_s = _event_s(leader, "state_changed", onset, new="hung")  # the verdict, before any capture
        run.evidence_s = _event_s(leader, "group_evidence", onset)
        leader.wait(lambda s: s["restarts"] >= 1 and group_ready(s), 120, "the group ready again")
        run.ready_s = round(time.time() - onset, 2)
        run.bundles = sum((d.state_dir / "diagnostics" / inc["id"] / "summary.json").exists() for d in (leader, worker))
        return
    if fault == "node_loss_return":
        measure_loss(run, leader, worker, onset)
        return
    if fault in LEADER_KILLED:
        measure_leader_killed(fault, run, leader, worker, onset)
        return
    if fault == "leader_daemon_sigkill":
        time.sleep(2.0)
        leader.start()
        leader.wait(lambda s: group_ready(s) and bool(s.get("adopted")), 60, "the successor leading a ready group")
        run.ready_s = round(time.time() - onset, 2)
        return
    leader.wait(lambda s: (s.get("group") or {}).get("status") == "degraded", 30, "the group degraded")
    run.degraded_s = round(time.time() - onset, 2)
    if fault == "member_daemon_sigkill":
        worker.start()
    else:
        time.sleep(2.0)
        assert worker.proc is not None
        worker.proc.send_signal(signal.SIGCONT)
    leader.wait(lambda s: group_ready(s) and s["group"]["status"] == "ok", 60, "the group whole again")
    run.ready_s = round(time.time() - onset, 2)


def measure_loss(run: Run, leader: Daemon, worker: Daemon, onset: float) -> None:
    """Node 1 away AWAY_S (under absent_wait_s): the group is degraded and waits, no ladder step;
    back, node 1 asks its leader and the group is relaunched together on the same rung."""
    leader.wait(lambda s: (s.get("group") or {}).get("status") == "degraded", 30, "the group degraded")
    run.degraded_s = round(time.time() - onset, 2)
    time.sleep(max(0.0, onset + AWAY_S - time.time()))
    st = leader.status()
    if st is None or st["state"] not in ("ready", "degraded") or st["restarts"] != 0:
        raise AssertionError(f"node 0 did not wait for the node away: {str(st)[:300]}")
    worker.start()
    leader.wait(
        lambda s: group_ready(s) and s["group"]["status"] == "ok" and s["group"]["nodes"][1].get("pid") is not None,
        120,
        "the group whole again",
    )
    run.ready_s = round(time.time() - onset, 2)


def _next_event(d: Daemon, pred: Any, after: float, timeout: float, what: str) -> dict[str, Any]:
    """The first journal event after `after` (epoch s) that `pred` accepts, read every 20 ms."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        for e in d.events():
            if parse_ts(str(e["ts"])) >= after - 0.5 and pred(e):
                return e
        time.sleep(0.02)
    raise AssertionError(f"no {what} in {timeout:g} s ({d.wd})")


def measure_leader_killed(fault: str, run: Run, leader: Daemon, worker: Daemon, onset: float) -> None:
    """The group restart of node 1's dead rank, with the leader daemon SIGKILLed at its stop step
    (node 1 was just asked to stop) or its launch step (node 1 was just launched by the group).
    Its successor must finish the restart on the same rung: no node left stopped, no second step."""
    if fault == "leader_killed_at_stop":
        _next_event(
            worker,
            lambda e: e.get("event") == "command" and e.get("kind") == "stop" and e.get("source") == "group",
            onset,
            60,
            "group stop on node 1",
        )
    else:
        _next_event(worker, lambda e: e.get("event") == "server_launched", onset, 90, "group launch on node 1")
    kill_daemon(leader)
    last = [e for e in leader.events() if parse_ts(str(e["ts"])) >= onset - 0.5]
    run.killed_after = str(last[-1].get("event")) if last else ""
    time.sleep(1.0)
    leader.start()
    leader.wait(lambda s: group_ready(s) and s["group"]["status"] == "ok", 120, "the group ready again")
    run.ready_s = round(time.time() - onset, 2)
    inc = [e for e in leader.events() if e.get("event") == "incident"]
    if inc:
        run.cause = str(inc[0].get("cause"))


def _s(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f} s"


def target(fault: str, rs: list[Run]) -> str:
    """What the trial must show, and whether every run showed it (a run with an error did not:
    `end_check` turns different rungs, a node not serving and a ladder step into its error)."""
    clean = bool(rs) and all(not r.error for r in rs)
    if fault == "config_mismatch":  # node 1 refused: it launches nothing (-1 = no launch)
        return "refused, node 1 never launched: " + met(clean and all(r.restarts[1:] == [-1] for r in rs))
    if fault in ("rank_sigkill", "rank_sigstop"):
        return "one rung, 1 ladder step: " + met(clean and all(r.steps == 1 for r in rs))
    if fault in LEADER_KILLED:
        return "one rung, no extra ladder step, no node stopped: " + met(clean and all(r.steps <= 1 for r in rs))
    if fault == "never_joins" or fault == "node_loss_return":
        return "one rung, 0 ladder steps: " + met(clean and all(r.steps == 0 for r in rs))
    return "one rung, 0 restarts: " + met(clean and all(sum(r.restarts) == 0 for r in rs))


def render(runs: list[Run], reps: int) -> str:
    rows = []
    for fault in FAULTS:
        rs = [r for r in runs if r.fault == fault]
        if not rs:
            continue
        ok = [r for r in rs if not r.error]

        def med(attr: str, ok: list[Run] = ok) -> float | None:
            xs = [getattr(r, attr) for r in ok if getattr(r, attr) is not None]
            return median(xs) if xs else None

        first = ok[0] if ok else None
        rows.append(
            [
                fault,
                f"{len(ok)}/{len(rs)}",
                (first.cause or "-") if first else "-",
                _s(med("verdict_s")),
                _s(med("evidence_s")),
                f"{first.bundles}/2" if first and fault in INCIDENT_FAULTS else "-",
                _s(med("degraded_s")),
                _s(med("ready_s")),
                ", ".join("/".join(str(x) for x in r.restarts) for r in rs),
                ", ".join(str(r.steps) for r in rs),
                ", ".join("/".join(x or "none" for x in r.rungs) if r.rungs else "?" for r in rs),
                target(fault, rs),
            ]
        )
    head = [
        "fault",
        "runs ok",
        "group verdict",
        "onset to verdict",
        "to evidence",
        "bundles",
        "to degraded",
        "to group ready",
        "restarts (node 0/1)",
        "ladder steps",
        "rungs at end (node 0/1)",
        "target",
    ]
    errors = [f"- {r.fault}: {r.error}" for r in runs if r.error]
    named = list(dict.fromkeys(f"- {r.fault}: {r.named}" for r in runs if r.named))
    killed = list(dict.fromkeys(f"`{r.killed_after}`" for r in runs if r.fault in LEADER_KILLED and r.killed_after))
    intro = header(
        "Multi-node",
        "multinode",
        f"Two simulated nodes (tp 2, one rank per node), one real daemon per node, {reps} run(s) per trial, "
        "poll 0.5 s, stall windows 4 s, `unreachable_s` 2 s, a ladder of two rungs (`base`, `second`) with "
        "3 retries per rung, 2 clients of 400 tokens on node 0. Times are medians from the onset (the "
        "benchmark's own act).",
    ).replace("bench.run_all --only multinode", "bench.multinode")
    notes = [
        "Onset to verdict: to the leader's `hung` (before any capture); to evidence: the leader's "
        "`group_evidence` (every member's capture answered). Every trial ends with the same check: each "
        "daemon's own `/status` says which rung its node serves, and a run whose nodes end on different "
        "rungs (or with a node that serves nothing, but in `config_mismatch`, where node 1 launches nothing and node 0 "
        "waits for it at the rendezvous) fails; a ladder step is a `ladder_decision` of the "
        "leader that the ladder judged (not a relaunch forced on the same rung because a node was away or "
        "late), and only the servers' own faults may cause one. `never_joins` starts node 1's daemon only "
        f"after the verdict, so node 1 has no bundle for it; the leader waits `absent_wait_s` (6 s here; "
        f"120 s in the start trials, {LOSS_WAIT_S:g} s in `node_loss_return`) for the absent node first, "
        "then relaunches the same rung. The daemon faults must cost no restart on any node. The start "
        "trials start one daemon, then the other 15 or 60 s later (to group ready: from the first start; "
        "any incident fails the run); `config_mismatch` gives node 1 `tp-size 4` (to degraded: until "
        "node 1 journals its refused launch naming `tp-size`; restarts -1: it never launched).",
        "",
        f"`node_loss_return` SIGKILLs node 1's daemon and its server together, keeps the node away "
        f"{AWAY_S:g} s (the group is `degraded`, node 0's collectives wait for the lost rank), then starts "
        "node 1's daemon again: it adopts nothing, asks its leader, and node 0's old server cannot take a new "
        "node 1, so the group is relaunched together on the same rung (one restart per node, no ladder "
        "step). `leader_killed_at_stop` and `leader_killed_at_launch` SIGKILL node 1's scheduler and then "
        "the leader daemon as node 1 journals the group's stop command, or its group launch; a successor "
        "starts 1 s later and must finish the restart on the same rung with no node left stopped and no "
        "second ladder decision (to group ready: from the rank's death)."
        + (f" The leader's last journal line before the kill: {', '.join(killed)}." if killed else ""),
        "",
    ]
    body = [intro, "", table(head, rows), "", *notes]
    if named:
        body += ["How the verdict named the node:", *named, ""]
    if errors:
        body += ["Errors:", *errors, ""]
    return "\n".join(body)


def main(argv: list[str] | None = None) -> int:
    args_in = list(argv if argv is not None else sys.argv[1:])
    if args_in[:1] == ["--recovery"]:  # issue 54's cases: the group recovers as one (bench/group_recovery.py)
        from bench import group_recovery

        return group_recovery.main(args_in[1:])
    p = argparse.ArgumentParser(
        description=__doc__.splitlines()[0] if __doc__ else None,
        epilog="`--recovery [ARGS]` (first) runs bench.group_recovery, issue 54's cases, with ARGS.",
    )
    p.add_argument("--reps", type=int, default=1, help="runs per fault")
    p.add_argument("--only", choices=FAULTS, action="append", help="only these faults (repeatable)")
    p.add_argument("--no-write", action="store_true", help="print the table, leave docs/BENCHMARKS.md alone")
    p.add_argument("--render", action="store_true", help="only render the last saved results again")
    args = p.parse_args(argv)
    faults = tuple(args.only or FAULTS)
    if args.render:
        runs = [Run(**r) for r in load_result("multinode") or []]
        args.reps = max((sum(r.fault == f for r in runs) for f in FAULTS), default=1)
    else:
        runs = [run_fault(f) for f in faults for _ in range(args.reps)]
        if args.only:  # the other trials' last results stay in the table
            kept = [Run(**r) for r in load_result("multinode") or [] if r["fault"] not in faults]
            runs = sorted(kept + runs, key=lambda r: FAULTS.index(r.fault))
        save_result("multinode", [r.__dict__ for r in runs])
    body = render(runs, args.reps)
    if args.no_write:
        print(body)
    else:
        publish("multinode", body)
    return 0 if not any(r.error for r in runs) else 1


if __name__ == "__main__":
    raise SystemExit(main())
