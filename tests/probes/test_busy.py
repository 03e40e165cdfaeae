"""The py-spy look at busy threads: parsing, and the real tool against real spinning processes."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from probes.busy import BusyProbe, parse_active_threads, py_spy_look_argv
from probes.types import ProcInfo, TreeObservation
from supervisor.diagnostics.tools import find_py_spy
from supervisor.policy.gpuwait import sample_kind, thread_kind

FIXTURES = Path(__file__).parent / "fixtures"
REPO = Path(__file__).resolve().parents[2]
SPY = find_py_spy()

SPINNER = """
import sys
from supervisor.simulator.mirror.sglang.srt.speculative.eagle_draft_cuda_graph_runner import EAGLEDraftCudaGraphRunner
class Never:
    finished = False
print("spinning", flush=True)
EAGLEDraftCudaGraphRunner((1, 2), lambda bs: Never())
"""
COMPILER = """
from supervisor.simulator.mirror.torch._inductor.compile_fx import compile_fx_inner
print("compiling", flush=True)
compile_fx_inner("g", 4, 600.0)
"""


def test_argv_never_pauses_or_reads_locals() -> None:
    argv = py_spy_look_argv("/x/py-spy", 7)
    assert "--nonblocking" in argv and "--native" not in argv and "--locals" not in argv


def test_parse_keeps_active_threads_innermost_first() -> None:
    threads = parse_active_threads(1, (FIXTURES / "sim-busy-capture-pyspy.txt").read_text())
    assert [t.name for t in threads] == ["MainThread"]
    top = threads[0].frames[0]
    assert top.function == "Event.synchronize" and top.file.endswith("torch/cuda/streams.py") and top.line == 29
    assert thread_kind(threads[0]) == "gpu_wait"


def test_parse_torch_shaped_dump() -> None:
    """Module paths and functions as torch 2.11 and SGLang 0.5.16 name them (written in py-spy's format,
    not recorded from a GPU): CUDA synchronize and a c10d barrier wait; a woken queue thread is idle."""
    threads = parse_active_threads(4242, (FIXTURES / "torch-shaped-waits-pyspy.txt").read_text())
    assert [t.name for t in threads] == ["MainThread", "pt_autograd_0", "watchdog"]
    assert threads[2].tid is None  # a thread py-spy names by address
    assert [thread_kind(t) for t in threads] == ["gpu_wait", "idle", "gpu_wait"]


def _tree(*pids: int) -> TreeObservation:
    procs = tuple(
        ProcInfo(
            pid=p,
            ppid=1,
            title="t",
            status="running",
            role="scheduler",
            rank=None,
            cpu_time_s=0.0,
            rss_bytes=0,
            read_chars=0,
            write_chars=0,
            num_threads=1,
        )
        for p in pids
    )
    return TreeObservation(
        root_pid=pids[0],
        root_alive=True,
        root_exit=None,
        processes=procs,
        cpu_time_s=0.0,
        rss_bytes=0,
        read_chars=0,
        write_chars=0,
    )


def test_rates_come_from_consecutive_notes() -> None:
    clock = iter([0.0, 1.0])
    probe = BusyProbe(None, monotonic=lambda: next(clock))
    tree = _tree(5)
    assert probe.note(tree) == {}
    moved = replace(tree, processes=(replace(tree.processes[0], cpu_time_s=0.9),))
    assert probe.note(moved) == {5: pytest.approx(0.9)}


@pytest.fixture
def spinning() -> Iterator[subprocess.Popen[str]]:
    yield from _child(SPINNER, "spinning")


@pytest.fixture
def compiling() -> Iterator[subprocess.Popen[str]]:
    yield from _child(COMPILER, "compiling")


def _child(code: str, ready: str) -> Iterator[subprocess.Popen[str]]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=env)
    assert child.stdout is not None and child.stdout.readline().strip() == ready
    time.sleep(0.2)
    try:
        yield child
    finally:
        child.kill()
        child.wait()
        child.stdout.close()


@pytest.mark.skipif(SPY is None, reason="py-spy not installed")
def test_a_real_spin_in_synchronize_is_a_gpu_wait(spinning: subprocess.Popen[str]) -> None:
    sample = BusyProbe(SPY, timeout_s=10).sample({spinning.pid: 1.0})
    assert sample.error == "" and sample.pids == (spinning.pid,)
    assert sample_kind(sample) == "gpu_wait", sample
    assert sample.threads[0].frames[0].code == "pass" or "finished" in sample.threads[0].frames[0].code


@pytest.mark.skipif(SPY is None, reason="py-spy not installed")
def test_a_real_compile_is_progress(compiling: subprocess.Popen[str]) -> None:
    sample = BusyProbe(SPY, timeout_s=10).sample({compiling.pid: 1.0})
    assert sample_kind(sample) == "compile", sample


def test_py_spy_missing_is_recorded_not_raised() -> None:
    sample = BusyProbe(None).sample({os.getpid(): 1.0})
    assert "py-spy not found" in sample.error and sample.threads == ()
    assert sample_kind(sample) == "error"


def test_quiet_processes_are_not_looked_at(tmp_path: Path) -> None:
    sample = BusyProbe(str(tmp_path / "never-run")).sample({1: 0.01})
    assert sample.pids == () and sample.error == "" and sample_kind(sample) == "none"


@pytest.mark.integration  # waits out the tool's timeout
def test_py_spy_failing_or_hanging_is_bounded_and_recorded(tmp_path: Path) -> None:
    failing = tmp_path / "py-spy-fails"
    failing.write_text("#!/bin/sh\necho 'Error: Permission Denied (os error 13)' >&2\nexit 1\n")
    failing.chmod(0o755)
    sample = BusyProbe(str(failing)).sample({os.getpid(): 1.0})
    assert "Permission Denied" in sample.error and sample_kind(sample) == "error"
    hanging = tmp_path / "py-spy-hangs"
    hanging.write_text("#!/bin/sh\nexec sleep 30\n")
    hanging.chmod(0o755)
    tic = time.monotonic()
    sample = BusyProbe(str(hanging), timeout_s=0.5).sample({os.getpid(): 1.0})
    assert time.monotonic() - tic < 5 and "took over 0.5 s" in sample.error


def test_hostile_dumps_are_bounded(tmp_path: Path) -> None:
    many = "\n".join(f'Thread {i} (active): "t{i}"\n    run (x.py:1)' for i in range(500))
    assert len(parse_active_threads(1, many)) == 64
    deep = 'Thread 1 (active): "t"\n' + "\n".join(f"    f{i} (x.py:{i})" for i in range(1000))
    assert len(parse_active_threads(1, deep)[0].frames) == 40
    big = tmp_path / "big.py"
    big.write_text("x = 1\n" * 500_000)  # 3 MB: its lines are not read
    out = parse_active_threads(1, f'Thread 1 (active): "t"\n    f ({big}:1)\n    g ({tmp_path / "gone.py"}:3)')
    assert [f.code for f in out[0].frames] == ["", ""]
