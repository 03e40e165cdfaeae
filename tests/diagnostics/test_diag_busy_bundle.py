"""A busy hang's bundle (issue 22) from a real spinning process: GPM in the GPU section, the host frame
waiting for the GPU named, and SGLang's own watchdog dump kept and classified when its process is gone."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from probes.types import GpmDevice, GpmObservation, GpuDevice, GpuObservation, GpuProcess
from supervisor.diagnostics import CaptureRequest, capture
from supervisor.diagnostics.capturerecords import Evidence, Frame, ProcEvidence, StackThread
from supervisor.diagnostics.kernels import kernel_lines, resident
from supervisor.diagnostics.sglangdump import with_sglang_dumps

if TYPE_CHECKING:
    from conftest import InfoFn

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]
PY_SPY = str(Path(sys.executable).parent / "py-spy")
SPINNER = (
    "from supervisor.simulator.mirror.sglang.srt.speculative.eagle_draft_cuda_graph_runner import "
    "EAGLEDraftCudaGraphRunner\nclass K:\n    finished = False\nprint('spinning', flush=True)\n"
    "EAGLEDraftCudaGraphRunner((1,), lambda bs: K())\n"
)
GONE_PID = 999_999_901  # a scheduler SGLang already killed: only its own dump remains
SGLANG_DUMP = f"""[2026-12-01 10:00:00 TP0] Pyspy dump for PID {GONE_PID} (py-spy dump --native --pid {GONE_PID}):
Process {GONE_PID}: sglang::scheduler_TP0
Python v3.12.3 (/usr/bin/python3.12)

Thread {GONE_PID} (active+gil): "MainThread"
    synchronize (torch/cuda/streams.py:225)
    capture_one_shape (sglang/srt/speculative/eagle_draft_cuda_graph_runner.py:470)
    capture (sglang/srt/model_executor/runner/decode_cuda_graph_runner.py:860)
"""


@pytest.fixture
def spinner() -> Iterator[subprocess.Popen[str]]:
    child = subprocess.Popen(
        [sys.executable, "-c", SPINNER], stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(REPO)}
    )
    assert child.stdout is not None and child.stdout.readline().strip() == "spinning"
    try:
        yield child
    finally:
        child.kill()
        child.wait()
        child.stdout.close()


async def test_busy_bundle_names_the_wait_keeps_gpm_and_sglangs_dump(
    spinner: subprocess.Popen[str], proc_info: InfoFn, tmp_path: Path
) -> None:
    gpu = GpuObservation(
        "ok",
        "",
        devices=(GpuDevice(0, "GPU-0", "H200", 100.0, 1 << 30, 1 << 37),),
        processes=(GpuProcess(spinner.pid, 0, "GPU-0", 1 << 30),),
    )
    gpm = GpmObservation("ok", "", devices=(GpmDevice(0, "GPU-0", 0.0076, 0.0001),))
    dump = SGLANG_DUMP
    req = CaptureRequest(
        incident_id="20261201T100000Z-startup_stall",
        trigger="hung",
        cause="startup_stall",
        processes=(proc_info(spinner.pid, "scheduler", 0),),
        native=False,
        gdb=False,
        phase="capturing_graphs",
        gpu=gpu,
        gpm=gpm,
        tree_cpu_cores=1.0,
        gpu_util_percent=100.0,
        sglang_watchdog="Scheduler watchdog timeout (self.watchdog_timeout=300.0, self.soft=False)",
        sglang_dumps=((GONE_PID, dump),),
        log_tail=tuple(SGLANG_DUMP.splitlines()),
    )
    result = await capture(req, tmp_path, py_spy_path=PY_SPY, keep=5, max_bytes=10**9)
    assert result.error is None and result.path is not None
    summary = json.loads((result.path / "summary.json").read_text())
    waits = {k["pid"]: k for k in summary["gpu_kernels"]}
    assert "Event.synchronize" in waits[spinner.pid]["host_wait"] and waits[spinner.pid]["gpus"] == [0]
    assert "synchronize (torch/cuda/streams.py:225)" in waits[GONE_PID]["host_wait"]
    assert summary["nvml"]["gpm"]["devices"][0]["sm_active_ratio"] == 0.0076
    assert json.loads((result.path / "nvml.json").read_text())["gpm"]["status"] == "ok"
    assert result.hang_class == "cuda_graph_capture"
    text = (result.path / "summary.txt").read_text()
    assert "GPM: GPU 0 util 100 %, SM activity 0.76%" in text
    assert "SGLang's own watchdog fired: Scheduler watchdog timeout" in text
    assert "waited for by pid" in text and "kernel not named (no cuda-gdb)" in text
    kept = (result.path / "sglang-watchdog.txt").read_text()
    assert f"== py-spy dump of pid {GONE_PID}" in kept and "capture_one_shape" in kept


def test_resident_kernels_from_cuda_gdb_and_the_waiting_frame() -> None:
    wait = StackThread(7, "MainThread", (Frame("synchronize", "torch/cuda/__init__.py", 1083),), "active")
    idle = StackThread(8, "heartbeat", (Frame("wait", "threading.py", 331),), "idle")
    ev = Evidence(
        (
            ProcEvidence(7, "scheduler", 0, python=(idle, wait), gpu_kernels=("spin_kernel<int>",)),
            ProcEvidence(9, "scheduler", 1, gpu_kernels=("ncclDevKernel_AllReduce_Sum_f32_RING_LL",)),
            ProcEvidence(10, "main", None, python=(idle,)),
        )
    )
    gpu = GpuObservation("ok", "", processes=(GpuProcess(7, 0, "G0", 1), GpuProcess(9, 1, "G1", 1)))
    got = resident(ev, gpu)
    assert [(r["pid"], r["gpus"], r["kernels"]) for r in got] == [
        (7, [0], ["spin_kernel<int>"]),
        (9, [1], ["ncclDevKernel_AllReduce_Sum_f32_RING_LL"]),
    ]
    assert "in synchronize (torch/cuda/__init__.py:1083)" in str(got[0]["host_wait"]) and got[1]["host_wait"] is None
    assert kernel_lines(got)[:2] == [
        "  scheduler TP0 pid 7 on GPU 0: kernel spin_kernel<int>",
        "    waited for by pid 7 'MainThread' in synchronize (torch/cuda/__init__.py:1083)",
    ]


def test_sglang_dump_fills_only_what_the_tools_could_not_read() -> None:
    own = StackThread(5, "MainThread", (Frame("run", "x.py", 1),), "active")
    procs = [ProcEvidence(5, "scheduler", 0, python=(own,)), ProcEvidence(6, "scheduler", 1)]
    dump = 'Thread 6 (active): "MainThread"\n    synchronize (torch/cuda/streams.py:225)\n'
    out = with_sglang_dumps(procs, ((5, dump.replace("Thread 6", "Thread 5")), (6, dump), (77, dump), (78, "garbage")))
    assert out[0].python == (own,)  # the daemon's own stacks win
    assert out[1].python[0].frames[0].function == "synchronize"
    assert [p.pid for p in out] == [5, 6, 77] and out[2].role == "scheduler"
