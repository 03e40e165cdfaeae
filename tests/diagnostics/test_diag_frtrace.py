"""torch's Flight Recorder analyzer after the bundle (issue 35): a hang's capture reads the dumps and
writes the bundle without waiting for torch's `fr_trace` (it imports torch: 3-11 s); the daemon then
runs it over the bundle's own dumps and adds `fr-trace.txt`. Real stand-in ranks with real FIFOs,
a real capture, and a stand-in `torch.distributed.flight_recorder.fr_trace` module on the server's
PYTHONPATH that takes longer than the old 3 s bound."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from saying import saying_children

from probes.types import ProcInfo
from supervisor.diagnostics import CaptureRequest, capture
from supervisor.diagnostics.flightrec import DUMP_KEY, PIPE_KEY
from supervisor.diagnostics.frtrace import TRACE_FILE, trace_into_bundle

if TYPE_CHECKING:  # fixtures from conftest.py (import mode importlib: not importable at run time)
    from conftest import InfoFn

pytestmark = pytest.mark.integration
FR_RANK = str(Path(__file__).parents[1] / "support" / "fr_rank.py")
SECRET = "hf_frtrace_secret_0123456789"
KEEP = {"keep": 10, "max_bytes": 10**9}


def fake_torch(root: Path, seconds: float) -> Path:
    """A `torch` package holding only the analyzer's module: it sleeps, then prints what it was given."""
    pkg = root / "torch" / "distributed" / "flight_recorder"
    pkg.mkdir(parents=True)
    for d in (root / "torch", root / "torch" / "distributed", pkg):
        (d / "__init__.py").write_text("")
    (pkg / "fr_trace.py").write_text(
        "import os, sys, time\n"
        f"time.sleep({seconds})\n"
        "folder = sys.argv[1]\n"
        "print('stand-in fr_trace over', sorted(os.listdir(folder)), sys.argv[2:])\n"
        f"print('a frame that held a token: {SECRET}')\n"
    )
    return root


def rank_env(tmp_path: Path, **more: str) -> dict[str, str]:
    """The variables the daemon gives a server's ranks, with its FR folder made."""
    (tmp_path / "fr").mkdir()
    return {
        **os.environ,
        PIPE_KEY: str(tmp_path / "fr" / "pipe_rank_"),
        DUMP_KEY: str(tmp_path / "fr" / "nccl_trace_rank_"),
        "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
        **more,
    }


def hung(env: dict[str, str], *ranks: ProcInfo) -> CaptureRequest:
    return CaptureRequest(
        incident_id="20261206T063803Z-startup_stall",
        trigger="hung",
        cause="startup_stall",
        processes=ranks,
        py_spy=False,
        argv=(sys.executable, "-m", "sglang.launch_server", "--tp-size", str(len(ranks))),
        env=env,
        flight_recorder_wait_s=10.0,
    )


async def test_the_bundle_is_written_first_then_the_analyzer_adds_fr_trace(
    tmp_path: Path, proc_info: InfoFn
) -> None:
    env = rank_env(tmp_path, PYTHONPATH=str(fake_torch(tmp_path / "site", 3.5)), HF_TOKEN=SECRET)
    with saying_children() as start:
        r0 = start([sys.executable, FR_RANK, "0", "12", "started"], "ready", env)
        r1 = start([sys.executable, FR_RANK, "1", "11", "completed"], "ready", env)
        req = hung(env, proc_info(r0.pid, "scheduler", 0), proc_info(r1.pid, "scheduler", 1))
        result = await capture(req, tmp_path / "diag", **KEEP)
    assert result.path is not None and result.error is None
    fr = result.summary["flight_recorder"]
    assert isinstance(fr, dict) and fr["status"] == "ok" and fr["lagging_ranks"] == [1], fr
    files = set(os.listdir(result.path))
    assert {"fr-dump-rank0.pickle", "fr-dump-rank1.pickle"} <= files
    # The capture did not wait for torch's analyzer: the bundle is complete without it, and says so.
    assert TRACE_FILE not in files
    assert "torch's analyzer (fr_trace) runs once this bundle is written" in (result.path / "summary.txt").read_text()
    job = result.fr_trace
    assert job is not None and job.ranks == (0, 1) and job.bundle == result.path

    done = await trace_into_bundle(job, timeout_s=30.0)
    assert done.outcome == "written", done
    text = (result.path / TRACE_FILE).read_text()
    # It ran with the server's interpreter over copies named as torch names its dumps, past 3 s.
    assert "stand-in fr_trace over ['nccl_trace_rank_0', 'nccl_trace_rank_1']" in text, text
    assert "--allow-incomplete-ranks" in text
    assert SECRET not in text and "a frame that held a token" in text  # redacted like the rest


async def test_no_job_where_the_analyzer_must_not_or_cannot_run(tmp_path: Path, proc_info: InfoFn) -> None:
    """A dump that would run code never reaches torch's full unpickler; the reason is in the bundle."""
    env = rank_env(tmp_path, FR_EVIL_MARK=str(tmp_path / "evil-ran"))
    with saying_children() as start:
        r0 = start([sys.executable, FR_RANK, "0", "1", "started", "hostile"], "ready", env)
        result = await capture(hung(env, proc_info(r0.pid, "scheduler", 0)), tmp_path / "diag", **KEEP)
    assert result.path is not None and result.fr_trace is None
    assert not (tmp_path / "evil-ran").exists()
    why = (result.path / TRACE_FILE).read_text()
    assert why.startswith("torch's analyzer not run: not every dump read as plain data"), why


async def test_a_bundle_removed_before_the_analyzer_ran_is_left_alone(tmp_path: Path, proc_info: InfoFn) -> None:
    env = rank_env(tmp_path, PYTHONPATH=str(fake_torch(tmp_path / "site", 0.0)))
    with saying_children() as start:
        r0 = start([sys.executable, FR_RANK, "0", "3", "started"], "ready", env)
        result = await capture(hung(env, proc_info(r0.pid, "scheduler", 0)), tmp_path / "diag", **KEEP)
    assert result.path is not None and result.fr_trace is not None
    shutil.rmtree(result.path)  # retention, or an operator, took it meanwhile
    done = await trace_into_bundle(result.fr_trace, timeout_s=30.0)
    assert done.outcome == "gone" and not result.path.exists()
