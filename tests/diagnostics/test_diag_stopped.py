"""A stopped rank read by pystack, the sampling spread, and NCCL's RAS report, in real captures of
real process trees (deadlock_prog.py), with a real RAS server (tests/support/fake_ras.py)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import psutil
import pytest
from fake_ras import FakeRas, comm, report

from supervisor.diagnostics import CaptureRequest, capture
from supervisor.diagnostics.flightrec import launch_env
from supervisor.diagnostics.pystack import find_pystack, parse_pystack

if TYPE_CHECKING:
    from conftest import Launcher, ResumeLog

pytestmark = pytest.mark.integration
needs_pystack = pytest.mark.skipif(find_pystack() is None, reason="pystack not installed")
PY_SPY = str(Path(sys.executable).parent / "py-spy")
KEEP = {"keep": 10, "max_bytes": 10**9}

PYSTACK_TEXT = """\
Traceback for thread 11850 (python3) [] (most recent call last):
    (C) File "./nptl/pthread_create.c", line 442, in start_thread (/usr/lib/x86_64-linux-gnu/libc.so.6)
    (Python) File "/usr/lib/python3.12/threading.py", line 1002, in _bootstrap
        self._bootstrap_inner()
    (Python) File "/v/lib/python3.12/site-packages/torch/distributed/distributed_c10d.py", line 2806, in all_reduce
        work = group.allreduce([tensor], opts)
    (C) File "../sysdeps/nptl/futex-internal.c", line 57, in __futex_abstimed_wait_common64 (/lib/libc.so.6)

Traceback for thread 11808 (MainThread) [] (most recent call last):
    (Python) File "/tmp/slp.py", line 4, in <module>
        f()
"""


def test_pystack_text_is_read_innermost_first() -> None:
    first, second = parse_pystack(PYSTACK_TEXT)
    assert first.tid == 11850 and first.name == "python3"
    assert [f.function for f in first.frames] == [
        "__futex_abstimed_wait_common64",
        "all_reduce",
        "_bootstrap",
        "start_thread",
    ]
    assert first.frames[1].file == "torch/distributed/distributed_c10d.py" and first.frames[1].line == 2806
    assert first.frames[0].file == "libc.so.6" and first.frames[0].line is None
    assert second.frames[0].function == "<module>" and second.frames[0].file == "slp.py"
    assert parse_pystack("Engine error: Could not determine python version\n") == ()


def _request(tree_infos: tuple[object, ...], **kw: object) -> CaptureRequest:
    base: dict[str, object] = {
        "incident_id": "20261201T150000Z-serving_stall",
        "trigger": "hung",
        "cause": "serving_stall",
        "processes": tree_infos,
        "py_spy_timeout_s": 10.0,
        "budget_s": 15.0,
        "rung": "base",
    }
    base.update(kw)
    return CaptureRequest(**base)  # type: ignore[arg-type]


@needs_pystack
async def test_a_sigstopped_rank_gets_python_frames_from_pystack(
    launch: Launcher, resume: ResumeLog, tmp_path: Path
) -> None:
    tree = launch("deadlock", 2)
    stopped = tree.children[1]
    os.kill(stopped, signal.SIGSTOP)
    # The capture reads the state from /proc; on a loaded machine the stop lands a moment later.
    deadline = time.monotonic() + 10
    while psutil.Process(stopped).status() != psutil.STATUS_STOPPED and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    res = await capture(_request(tree.infos(), native=True), tmp_path, py_spy_path=PY_SPY, resume=resume, **KEEP)
    outcomes = {(t.pid, t.tool): t for t in res.tools}
    assert outcomes[(stopped, "py-spy")].outcome == "skipped", outcomes
    assert outcomes[(stopped, "pystack")].outcome == "ok", outcomes[(stopped, "pystack")]
    assert outcomes[(stopped, "pystack")].duration_s < 5
    assert (tree.children[0], "pystack") not in outcomes  # py-spy read the running rank
    assert res.path is not None
    text = (res.path / f"pystack-{stopped}.txt").read_text()
    assert "Traceback for thread" in text and "deadlock_prog.py" in text
    summary = json.loads((res.path / "summary.json").read_text())
    assert summary["stopped"] == [stopped]
    waits = [w for w in summary["waits"] if w["pid"] == stopped]
    assert any(w["file"] == "deadlock_prog.py" for w in waits), waits  # Python frames, not just /proc
    with open(f"/proc/{stopped}/stat") as f:
        assert f.read().rsplit(")", 1)[1].split()[0] == "T"  # left as found
    assert stopped not in {p for call in resume.calls for p in call}
    # Both ranks sampled, and how close together is in the bundle.
    sampling = summary["sampling"]
    assert sampling["ranks_sampled"] == 2 and sampling["rank_spread_s"] is not None
    assert 0 <= sampling["rank_spread_s"] < 5
    assert "ranks sampled within" in (res.path / "summary.txt").read_text()


async def test_every_rank_stopped_asks_no_flight_recorder_dump(
    launch: Launcher, resume: ResumeLog, tmp_path: Path
) -> None:
    """A SIGSTOPped rank cannot read its pipe: the capture does not write it and wait out the bound
    (5 s of a real vLLM bundle on an H100, with VLLM::EngineCore stopped), it says why."""
    tree = launch("deadlock", 2)
    for pid in tree.children:
        os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + 10

    def every_thread_stopped(pid: int) -> bool:  # the main thread stops first; on a loaded machine the rest later
        states = []
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError):
                states.append((task / "stat").read_text().rsplit(")", 1)[1].split()[0])
        return bool(states) and all(x == "T" for x in states)

    while time.monotonic() < deadline and not all(every_thread_stopped(p) for p in tree.children):
        await asyncio.sleep(0.01)
    fr_env = launch_env({}, tmp_path / "fr", 100)
    req = _request(tree.infos(), env=fr_env, flight_recorder_wait_s=5.0)
    res = await capture(req, tmp_path / "d", py_spy_path=PY_SPY, resume=resume, **KEEP)
    assert res.path is not None
    fr = json.loads((res.path / "summary.json").read_text())["flight_recorder"]
    assert fr["status"] == "stopped" and fr["pipes"] == {} and fr["wait_s"] == 0.0, fr
    assert "every rank (2) is stopped (state T)" in fr["text"]
    assert "NCCL Flight Recorder: not asked" in (res.path / "summary.txt").read_text()


async def test_the_ras_report_goes_in_the_bundle_and_names_the_missing_rank(
    launch: Launcher, resume: ResumeLog, tmp_path: Path
) -> None:
    tree = launch("deadlock", 2)
    ranks = tree.children
    ras = FakeRas(lambda: report([comm([ranks[0]], missing=[(1, ranks[1])])]))
    try:
        req = _request(tree.infos(), env={"NCCL_RAS_ADDR": ras.address})
        res = await capture(req, tmp_path, py_spy_path=PY_SPY, resume=resume, **KEEP)
    finally:
        ras.close()
    assert res.path is not None and (res.path / "ras.json").is_file()
    assert json.loads((res.path / "ras.json").read_text())["nccl_version"] == "2.28.9"
    summary = json.loads((res.path / "summary.json").read_text())
    assert summary["ras"]["status"] == "ok" and summary["ras"]["communicators"] == 1
    assert summary["collective"]["source"] == "ras" and summary["collective"]["missing_ranks"] == [1]
    assert res.hang_class == "collective" and res.classification.reasons[0].startswith("NCCL RAS")
    text = (res.path / "summary.txt").read_text()
    assert f"missing rank 1 pid {ranks[1]} (unresponsive)" in text
    assert "Collective class and missing rank from: ras" in text


async def test_no_ras_service_is_stated_not_an_error(launch: Launcher, resume: ResumeLog, tmp_path: Path) -> None:
    tree = launch("deadlock", 1)
    req = _request(tree.infos(), env={"NCCL_RAS_ADDR": "127.0.0.1:1"})
    res = await capture(req, tmp_path, py_spy_path=PY_SPY, resume=resume, **KEEP)
    summary = res.summary
    assert summary["ras"]["status"] == "absent" and summary["errors"] == []  # type: ignore[index]
    assert res.path is not None and not (res.path / "ras.json").exists()
    off = await capture(
        _request(tree.infos(), env={"NCCL_RAS_ENABLE": "0"}), tmp_path, py_spy_path=PY_SPY, resume=resume, **KEEP
    )
    assert off.summary["ras"]["status"] == "disabled"  # type: ignore[index]


def test_pystack_never_pauses_a_server_a_person_only_asked_about() -> None:
    from supervisor.diagnostics.pystack import pystack_argv

    assert pystack_argv(("pystack",), 7, native=True) == ("pystack", "remote", "7", "--no-color", "--native")
    assert pystack_argv(("py", "-m", "pystack"), 7, native=True, nonblocking=True) == (
        "py", "-m", "pystack", "remote", "7", "--no-color", "--no-block",
    )
    assert "--locals" not in pystack_argv(("pystack",), 7, native=False)
