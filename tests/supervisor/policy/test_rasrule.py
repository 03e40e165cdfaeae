"""NCCL RAS as a detector (issue 35): the pure rule over successive reports, as a table of polls."""

from __future__ import annotations

import pytest

from probes.ras import RasComm, RasMissing, RasRank, RasReport
from supervisor.policy.rasrule import RasState, fold_ras

PIDS = (101, 102)


def report(counts: tuple[int, ...], *, missing: tuple[RasMissing, ...] = (), pids: tuple[int, ...] = PIDS,
           status: str = "ok") -> RasReport:
    ranks = tuple(
        RasRank(i, pid, f"node{i}", i, i, counts=(("AllReduce", n), ("Broadcast", 1))) for i, (pid, n) in
        enumerate(zip(pids, counts, strict=True))
    )
    comm = RasComm("0xabc", len(ranks) + len(missing), ranks, missing)
    return RasReport(status, "127.0.0.1:28028", communicators=(comm,))  # type: ignore[arg-type]


def run(polls: list[tuple[float, RasReport | None]], confirm: float = 6.0, tree: tuple[int, ...] = PIDS):  # type: ignore[no-untyped-def]
    state, out = RasState(), []
    for now, rep in polls:
        state, v = fold_ras(state, rep, tree, now, confirm)
        out.append(v)
    return out


def test_frozen_differing_counts_are_a_hang_after_the_confirm_window() -> None:
    polls = [(t, report((8, 7))) for t in (0.0, 2.0, 4.0, 6.0)]
    got = run(polls)
    assert got[:3] == [None, None, None]
    v = got[3]
    assert v is not None and v.cause == "collective_hang" and v.lagging == (1,), v
    assert "rank 1 (pid 102 on node1) ran AllReduce 7 times, the others 8" in v.reason
    assert "no count moved for 6 s" in v.reason


@pytest.mark.parametrize(
    "polls",
    [
        [(0.0, report((8, 7))), (2.0, report((9, 8))), (4.0, report((10, 9))), (6.0, report((11, 10)))],  # moving
        [(t, report((8, 8))) for t in (0.0, 2.0, 4.0, 6.0, 8.0)],  # equal and frozen: idle, or graph replays
        [(0.0, report((8, 7))), (2.0, None), (4.0, None), (5.9, report((8, 7)))],  # not yet confirmed
        [(0.0, report((8, 7))), (4.0, report((8, 7), status="absent")), (8.0, report((8, 7)))],  # RAS gone: anew
        [(t, report((8, 7), pids=(201, 202))) for t in (0.0, 4.0, 8.0)],  # another job's communicator
    ],
)
def test_no_hang(polls) -> None:  # type: ignore[no-untyped-def]
    assert run(polls) == [None] * len(polls)


def test_a_dead_peer_is_rank_died_at_once_an_unresponsive_one_after_confirm() -> None:
    dead = RasMissing(1, 555, "node1", 0, unresponsive=True, dead=True)
    v = run([(0.0, report((8,), pids=(101,), missing=(dead,)))])[0]
    assert v is not None and v.cause == "rank_died" and v.lagging == (1,)
    assert "lost rank 1 (pid 555 on node1): NCCL considers it dead" in v.reason
    gone = RasMissing(1, 555, "node1", 0, unresponsive=True, dead=False)
    got = run([(t, report((8,), pids=(101,), missing=(gone,))) for t in (0.0, 3.0, 6.0)])
    assert got[:2] == [None, None] and got[2] is not None and "unresponsive" in got[2].reason
