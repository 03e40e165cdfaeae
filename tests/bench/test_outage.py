"""The outage benchmark's Xid case is wired as tests/integration/test_gpu_xid.py raises an Xid on CPU
(one GPU file, read by the daemon and written by the simulator; the Xid, then the rank it killed),
and `--case` keeps the other cases' published rows; nothing here starts a daemon."""

from __future__ import annotations

import importlib
import os
import signal
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def outage(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(ROOT))  # `python -m bench.outage` runs from the repository root
    return importlib.import_module("bench.outage")


def test_the_xid_case_shares_one_gpu_file_between_the_daemon_and_the_server(outage: ModuleType, tmp_path: Path) -> None:
    from supervisor.simulator.gpu.nvml import SimulatedNvml

    assert outage.CASES[outage.XID_CASE] == ("ok", False)  # the fault is the benchmark's, not the simulator's
    gpu = tmp_path / "nvml.json"
    s = outage._settings(tmp_path, "ok", True, {}, gpu)
    assert (s.gpu.source, s.gpu.file) == ("simulator", str(gpu))
    assert s.server.env["SGLANG_SIM_GPU_FILE"] == str(gpu)
    assert outage._settings(tmp_path, "ok", True, {}).gpu.source == "nvml"  # the other cases: unchanged
    outage.write_gpu_file(gpu, [])
    nvml = SimulatedNvml.from_file(gpu)
    nvml.nvmlInit()
    assert nvml.nvmlDeviceGetCount() == 2
    events = nvml.nvmlEventSetCreate()
    nvml.nvmlDeviceRegisterEvents(nvml.nvmlDeviceGetHandleByIndex(0), 0x8, events)
    outage.write_gpu_file(gpu, [(0, outage.XID)])
    assert nvml.nvmlEventSetWait(events, 1000).eventData == outage.XID


class FakeDaemon:
    """/status as the daemon answers it: the tree's processes, then the Xid once read from the file."""

    def __init__(self, gpu: Path, rank1: int) -> None:
        self.gpu, self.rank1 = gpu, rank1

    def status(self) -> dict[str, Any]:
        import json

        xids = json.loads(self.gpu.read_text())["xid_events"]
        procs = [{"pid": 1, "role": "scheduler", "rank": 0}, {"pid": self.rank1, "role": "scheduler", "rank": 1}]
        return {"processes": procs, "gpu_xids": [{"gpu": x["gpu"], "xid": x["xid"]} for x in xids]}

    def wait(self, pred: Any, timeout: float, what: str) -> dict[str, Any]:
        st = self.status()
        assert pred(st), what
        return st


def test_the_xid_comes_first_then_the_rank_it_killed_dies(outage: ModuleType, tmp_path: Path) -> None:
    gpu = tmp_path / "nvml.json"
    outage.write_gpu_file(gpu, [])
    rank1 = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        onset = outage.inject_xid(FakeDaemon(gpu, rank1.pid), gpu)
        assert rank1.wait(10) == -signal.SIGKILL
    finally:
        if rank1.poll() is None:
            os.kill(rank1.pid, signal.SIGKILL)
            rank1.wait()
    assert onset > 0 and '"xid": 31' in gpu.read_text()


def test_the_incident_must_name_the_xid_and_relaunch(outage: ModuleType) -> None:
    named = {"event": "incident", "xids": [{"gpu": 0, "xid": outage.XID}]}
    relaunched = [{"event": "launch_timeline", "after_gpu_fault": f} for f in (False, True)]
    assert outage._xid_named([named, *relaunched]) == ""
    assert "names no Xid" in outage._xid_named([{"event": "incident", "xids": []}, *relaunched])
    assert "no relaunch" in outage._xid_named([named, relaunched[0]])


def test_case_keeps_the_other_cases_published_rows(
    outage: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    report = tmp_path / "BENCHMARKS.md"
    old = [
        outage.OutageStory(case, caches, parts={"detection": 1.0}, total_s=9.0)
        for case in ("start-up deadlock", "crash")
        for caches in ("cold", "warm")
    ]
    report.write_text("<!-- section:outage -->\n" + outage.render(old) + "<!-- /section:outage -->\n")
    written: list[str] = []
    monkeypatch.setattr(outage, "REPORT", report)
    monkeypatch.setattr(outage, "story", lambda case, warm: outage.OutageStory(case, "warm" if warm else "cold"))
    monkeypatch.setattr(outage, "save_result", lambda name, data: None)
    monkeypatch.setattr(outage, "publish", lambda part, body: written.append(body))
    outage.main(["--case", "xid"])
    (body,) = written
    labels = [line.split("|")[1].strip() for line in body.splitlines() if line.startswith("| ") and "(" in line]
    assert labels == [
        "start-up deadlock (cold)",
        "start-up deadlock (warm)",
        "crash (cold)",
        "crash (warm)",
        "xid (cold)",
        "xid (warm)",
    ]
    assert "measured " in body and ": start-up deadlock, crash." in body  # when the kept rows were measured
    # a second --case run keeps the first run's rows and their stamp
    report.write_text("<!-- section:outage -->\n" + body + "<!-- /section:outage -->\n")
    kept = outage.published_rows()
    assert {k.case for k in kept} == {"start-up deadlock", "crash", "xid"}
    assert len({k.measured for k in kept if k.case != "xid"}) == 1
