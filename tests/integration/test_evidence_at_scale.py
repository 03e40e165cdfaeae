"""Through the running daemon: a SIGSTOPped rank read by pystack, NCCL's RAS report in the bundle,
and the spread between the ranks' samples (issue 24)."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
from fake_ras import FakeRas, comm, report
from serving import ready, traffic

from supervisor.diagnostics.pystack import find_pystack

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(find_pystack() is None, reason="pystack not installed"),
]


async def test_a_sigstopped_rank_has_python_frames_and_ras_names_it(daemon, sim) -> None:  # type: ignore[no-untyped-def]
    holder: list[object] = []

    def status() -> str:  # NCCL's view: TP0 waits in the all-reduce, TP1 (stopped) never answers
        if not holder:  # asked before the test holds the daemon
            return report([])
        ranks = sorted((p.rank, p.pid) for p in holder[0].snap().processes if p.role == "scheduler")  # type: ignore[attr-defined]
        if len(ranks) < 2:  # asked while the relaunch (at once since issue 36) has no ranks yet
            return report([])
        return report([comm([ranks[0][1]], missing=[(1, ranks[1][1])], counts=[9])])

    ras = FakeRas(status)
    try:
        settings = sim(
            "ok",
            tp=2,
            env={"NCCL_RAS_ADDR": ras.address},
            diagnostics={"native": True},
            restart={"retries_per_rung": 2},
        )
        r = await daemon(settings)
        holder.append(r)
        snap = await r.wait_for(ready, 40, "ready")
        tp1 = next(p.pid for p in snap.processes if p.role == "scheduler" and p.rank == 1)
        async with traffic(r.settings.server.port, concurrency=3):
            await r.wait_for(lambda x: (x.serving.running_reqs or 0) > 0, 20, "requests running")
            os.kill(tp1, signal.SIGSTOP)
            snap = await r.wait_for(lambda x: x.last_incident is not None and x.last_incident.bundle, 40, "incident")
    finally:
        ras.close()
    assert snap.last_incident is not None
    bundle = Path(r.settings.paths.state_dir) / "diagnostics" / str(snap.last_incident.bundle)
    summary = json.loads((bundle / "summary.json").read_text())
    ran = {(t["pid"], t["tool"]): t for t in summary["tools"]}
    assert ran[(tp1, "pystack")]["outcome"] == "ok", summary["tools"]
    assert ran[(tp1, "py-spy")]["outcome"] == "skipped"
    assert "Traceback for thread" in (bundle / f"pystack-{tp1}.txt").read_text()
    assert any(w["pid"] == tp1 and (w["file"] or "").endswith(".py") for w in summary["waits"]), summary["waits"]
    # NCCL's word, in the bundle, and the source of the collective class.
    assert (bundle / "ras.json").is_file() and summary["ras"]["status"] == "ok"
    assert summary["collective"] == {
        "source": "ras",
        "missing_ranks": [1],
        "operation": None,
        "text": summary["collective"]["text"],
    }
    assert snap.last_incident.hang_class == "collective"
    assert "STATUS" in ras.requests
    # The ranks' samples and how far apart.
    assert summary["sampling"]["ranks_sampled"] == 2 and summary["sampling"]["rank_spread_s"] is not None
    text = (bundle / "summary.txt").read_text()
    assert "Collective class and missing rank from: ras" in text and "ranks sampled within" in text
    await r.wait_for(lambda x: x.state == "ready" and x.restarts >= 1, 60, "relaunched and ready")
