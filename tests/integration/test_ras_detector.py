"""NCCL RAS as a detector (issue 35), through the running daemon: a fake `ncclras` service speaking
NCCL's real client protocol (tests/support/fake_ras.py) reports the serving tree's two ranks with
operation counts that differ and stay frozen; the daemon calls the hang after its confirm window and
names the lagging rank. A peer NCCL considers dead (on another node, its daemon gone) is rank_died."""

from __future__ import annotations

import pytest
from fake_ras import FakeRas, comm, report
from serving import ready

pytestmark = pytest.mark.integration

WATCH = {"ras_interval_s": 0.5, "ras_confirm_s": 2.0, "serving_stall_s": 120.0}


async def test_frozen_differing_counts_are_a_hang_naming_the_lagging_rank(daemon, sim) -> None:  # type: ignore[no-untyped-def]
    pids: list[int] = []
    ras = FakeRas(lambda: report([comm(pids, counts=[8, 7])] if pids else []))
    try:
        r = await daemon(sim("ok", tp=2, env={"NCCL_RAS_ADDR": ras.address}, watchdog=WATCH))
        snap = await r.wait_for(ready, 40, "ready")
        ranks = sorted((p.rank, p.pid) for p in snap.processes if p.role == "scheduler")
        assert [rk for rk, _ in ranks] == [0, 1]
        pids.extend(pid for _, pid in ranks)  # from now on NCCL's report names the tree's ranks
        snap = await r.wait_for(lambda x: x.last_incident is not None, 40, "the RAS detector's verdict")
    finally:
        ras.close()
    inc = snap.last_incident
    assert inc is not None and inc.cause == "serving_stall", inc
    assert f"rank 1 (pid {pids[1]} on 127.0.0.1) ran AllReduce 7 times, the others 8" in inc.detail, inc.detail
    assert "no count moved for" in inc.detail
    assert any(line.startswith("STATUS") or line == "STATUS" for line in ras.requests)


async def test_a_dead_peer_is_rank_died(daemon, sim) -> None:  # type: ignore[no-untyped-def]
    pids: list[int] = []

    def body() -> str:
        if not pids:
            return report([])
        c = comm(pids[:1], missing=[(1, 999999)])  # rank 1 lived on another node; NCCL lost it
        c["missing_ranks"][0]["status"] = {"unresponsive": True, "considered_dead": True}  # type: ignore[index]
        return report([c])

    ras = FakeRas(body)
    try:
        r = await daemon(sim("ok", tp=1, env={"NCCL_RAS_ADDR": ras.address}, watchdog=WATCH))
        snap = await r.wait_for(ready, 40, "ready")
        pids.append(next(p.pid for p in snap.processes if p.role == "scheduler"))
        snap = await r.wait_for(lambda x: x.last_incident is not None, 40, "rank_died from RAS")
    finally:
        ras.close()
    inc = snap.last_incident
    assert inc is not None and inc.cause == "rank_died", inc
    assert "lost rank 1 (pid 999999 on 127.0.0.1): NCCL considers it dead" in inc.detail, inc.detail
