"""The group's verdict from the leader's own verdict and the members' reports: a table."""

from __future__ import annotations

import pytest

from supervisor.group.verdict import (
    GroupVerdict,
    MemberView,
    NodeReport,
    OwnVerdict,
    RankView,
    combine,
    group_serves,
)

SERVING = OwnVerdict("ready", "ready", None, "healthy", "serving")
STALL = OwnVerdict("ready", "incident", "serving_stall", "4 running, no decode tokens for 10 s", "serving")
START_STALL = OwnVerdict("starting", "incident", "startup_stall", "no channel moved for 30 s", "initializing")
STARTING = OwnVerdict("starting", "starting", None, "initializing", "initializing")


def ranks(*statuses: str) -> tuple[RankView, ...]:
    main = RankView(100, "main", None, "sleeping")
    return (main, *(RankView(101 + i, "scheduler", i + 1, s) for i, s in enumerate(statuses)))


def report(
    state: str = "ready",
    *,
    phase: str = "serving",
    cause: str | None = None,
    reason: str = "",
    tree: tuple[RankView, ...] = ranks("sleeping"),
    lost: tuple[int, ...] = (),
    pid: int | None = 100,
) -> NodeReport:
    return NodeReport(1, state, phase, pid, "base", cause, reason, tree, lost, 0.5, 1000.0)


def member(r: NodeReport | None, *, reachable: bool = True, down_s: float = 0.0, node: int = 1) -> MemberView:
    if r is not None and node != 1:
        r = NodeReport(node, *[getattr(r, f) for f in NodeReport.__dataclass_fields__ if f != "node"])
    return MemberView(node, f"h{node}:8900", reachable, r, down_s, "" if reachable else "connection refused")


CASES = [
    ("all serving", SERVING, (member(report()),), GroupVerdict("ok", reason="every node reports")),
    (
        "a worker's rank died: its own verdict is the group's incident",
        SERVING,
        (member(report("hung", cause="rank_died", reason="child process(es) [102] exited")),),
        GroupVerdict("incident", "rank_died", "node 1: child process(es) [102] exited", node=1),
    ),
    (
        "a worker whose main exited (its only rank died): a dead rank of the group",
        SERVING,
        (member(report("hung", cause="exited", reason="server main process exited 3")),),
        GroupVerdict("incident", "rank_died", "node 1: server main process exited 3", node=1),
    ),
    (
        "a worker's start-up stalled",
        STARTING,
        (member(report("hung", phase="loading_weights", cause="startup_stall", reason="no channel moved")),),
        GroupVerdict("incident", "startup_stall", "node 1: no channel moved", node=1),
    ),
    (
        "node 0's serving stall is named by the worker whose rank stopped",
        STALL,
        (member(report(tree=ranks("stopped"))),),
        GroupVerdict(
            "incident", "serving_stall", f"{STALL.reason}; node 1 rank 1 pid 101 stopped (state T)", node=1, rank=1
        ),
    ),
    (
        "the stopped rank on the second of two workers",
        STALL,
        (member(report()), member(report(tree=ranks("sleeping", "stopped")), node=2)),
        GroupVerdict(
            "incident", "serving_stall", f"{STALL.reason}; node 2 rank 2 pid 102 stopped (state T)", node=2, rank=2
        ),
    ),
    (
        "node 0's stall with a worker that lost a rank",
        STALL,
        (member(report(lost=(102,))),),
        GroupVerdict("incident", "serving_stall", f"{STALL.reason}; node 1 lost rank process(es) [102]", node=1),
    ),
    (
        "a node that never joins: node 0 stalls at start, the worker is behind",
        START_STALL,
        (member(report("starting", phase="spawning")),),
        GroupVerdict(
            "incident", "startup_stall", f"{START_STALL.reason}; node 1 never joined (still spawning)", node=1
        ),
    ),
    (
        "a node that never launched",
        START_STALL,
        (member(report("stopped", phase="spawning", pid=None, tree=())),),
        GroupVerdict(
            "incident", "startup_stall", f"{START_STALL.reason}; node 1 runs no server (state stopped)", node=1
        ),
    ),
    (
        "node 0 stalls, its member cannot be asked: still the servers' incident, named",
        START_STALL,
        (member(None, reachable=False, down_s=3.0),),
        GroupVerdict(
            "incident", "startup_stall", f"{START_STALL.reason}; node 1 cannot be asked (connection refused)", node=1
        ),
    ),
    (
        "node 0's stall and nothing on the members: node 0 itself",
        STALL,
        (member(report()),),
        GroupVerdict("incident", "serving_stall", f"node 0: {STALL.reason}", node=0),
    ),
    (
        "an unreachable member is not an incident: degraded once past the window",
        SERVING,
        (member(report(), reachable=False, down_s=12.0),),
        GroupVerdict("degraded", reason="node 1 daemon unreachable for 12 s (connection refused)", degraded=(1,)),
    ),
    (
        "an unreachable member within the window: nothing yet",
        SERVING,
        (member(report(), reachable=False, down_s=3.0),),
        GroupVerdict("ok", reason="every node reports"),
    ),
    (
        "a member daemon that restarted and adopts (starting): degraded, not an incident",
        SERVING,
        (member(report("starting", phase="spawning")),),
        GroupVerdict("degraded", reason="node 1 is starting", degraded=(1,)),
    ),
    (
        "an unreachable member's old report with a cause is not acted on",
        SERVING,
        (member(report("hung", cause="rank_died", reason="x"), reachable=False, down_s=1.0),),
        GroupVerdict("ok", reason="every node reports"),
    ),
    (
        "node 0's own exit",
        OwnVerdict("ready", "incident", "exited", "server main process exited 1", "serving"),
        (member(report()),),
        GroupVerdict("incident", "exited", "node 0: server main process exited 1", node=0),
    ),
]


# Issue 54: a start-up hang on every node is the rung's (named alike), never "a node away"; a member's
# stall at the rendezvous is explained by the node that never came, at any group size.
KV_STALL = OwnVerdict("starting", "incident", "startup_stall", "no channel moved for 30 s", "allocating_kv")
KV_STARTING = OwnVerdict("starting", "starting", None, "allocating_kv", "allocating_kv")
ALIKE = "nodes 0, 1 showed the fault alike in phase allocating_kv: the rung's, not a node away"
CASES += [
    (
        "node 0 stalls after the load, node 1 stalled in the same phase: alike, node 0's, not 'never joined'",
        KV_STALL,
        (member(report("starting", phase="allocating_kv")),),
        GroupVerdict("incident", "startup_stall", f"node 0: {KV_STALL.reason}; {ALIKE}", node=0, alike=(0, 1)),
    ),
    (
        "node 1 holds the same stall node 0 sees: named alike",
        KV_STALL,
        (member(report("hung", phase="allocating_kv", cause="startup_stall", reason="no channel moved")),),
        GroupVerdict("incident", "startup_stall", f"node 1: no channel moved; {ALIKE}", node=1, alike=(0, 1)),
    ),
    (
        "node 1 holds its stall, node 0 still within its window: node 1 alone",
        KV_STARTING,
        (member(report("hung", phase="allocating_kv", cause="startup_stall", reason="no channel moved")),),
        GroupVerdict("incident", "startup_stall", "node 1: no channel moved", node=1),
    ),
    (
        "node 1 behind node 0 past the rendezvous: still named as the one behind",
        KV_STALL,
        (member(report("starting", phase="loading_weights")),),
        GroupVerdict(
            "incident", "startup_stall", f"{KV_STALL.reason}; node 1 never joined (still loading_weights)", node=1
        ),
    ),
    (
        "a member's crash-loop with node 0 stalling after it: the member's, not node 0's",
        STALL,
        (member(report("hung", cause="rank_died", reason="child process(es) [102] exited")),),
        GroupVerdict("incident", "rank_died", "node 1: child process(es) [102] exited", node=1),
    ),
    (
        "three nodes: node 1 holds its stall at the rendezvous, node 2 cannot be asked: node 2 is named",
        STARTING,
        (
            member(report("hung", phase="initializing", cause="startup_stall", reason="no channel moved")),
            member(None, reachable=False, down_s=40.0, node=2),
        ),
        GroupVerdict(
            "incident",
            "startup_stall",
            "node 1: no channel moved; node 2 cannot be asked (connection refused)",
            node=2,
            stalled_for=1,
        ),
    ),
    (
        "three nodes: node 1 holds its stall at the rendezvous, node 2 started late: node 2 is named",
        STARTING,
        (
            member(report("hung", phase="initializing", cause="startup_stall", reason="no channel moved")),
            member(report("starting", phase="spawning"), node=2),
        ),
        GroupVerdict(
            "incident",
            "startup_stall",
            "node 1: no channel moved; node 2 never joined (still spawning)",
            node=2,
            stalled_for=1,
        ),
    ),
    (
        "three nodes: node 0 and node 1 wait at the rendezvous, node 2 cannot be asked: node 2 is named",
        START_STALL,
        (member(report("starting", phase="initializing")), member(None, reachable=False, down_s=40.0, node=2)),
        GroupVerdict(
            "incident", "startup_stall", f"{START_STALL.reason}; node 2 cannot be asked (connection refused)", node=2
        ),
    ),
]


@pytest.mark.parametrize("own,members,want", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_group_verdict(own: OwnVerdict, members: tuple[MemberView, ...], want: GroupVerdict) -> None:
    assert combine(own, members, unreachable_s=10.0) == want


@pytest.mark.parametrize(
    "own_state,members,serves",
    [
        ("ready", (member(report()),), True),
        ("ready", (member(report(), reachable=False, down_s=60.0),), True),
        ("ready", (member(report("starting")),), False),
        ("ready", (member(report("hung", cause="rank_died")),), False),
        ("starting", (member(report()),), False),
        ("degraded", (member(None),), True),
    ],
)
def test_group_serves(own_state: str, members: tuple[MemberView, ...], serves: bool) -> None:
    assert group_serves(own_state, members) is serves
