"""CPU that only waits on the GPU is not progress: the pure rules, on recorded and shaped samples."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from observations import obs

from probes.busy import parse_active_threads
from probes.types import (
    BusySample,
    BusyThread,
    GpmDevice,
    GpmObservation,
    GpuDevice,
    GpuObservation,
    GpuProcess,
    PyFrame,
)
from supervisor.config.settings import WatchdogSettings
from supervisor.policy.gpuwait import (
    BusyState,
    fold_busy,
    gpu_bound,
    gpu_spinning,
    sample_kind,
    thread_kind,
    wants_look,
)
from supervisor.policy.watchdog import History, assess, new_history

FIXTURES = Path(__file__).resolve().parents[2] / "probes" / "fixtures"
S = WatchdogSettings(poll_interval_s=2, startup_stall_s=60, startup_timeout_s=3600, cpu_only_stall_s=900)
GB = 1 << 30


def t(*frames: tuple[str, str, str]) -> BusyThread:
    return BusyThread(pid=1, tid=1, name="MainThread", frames=tuple(PyFrame(f, p, 1, c) for f, p, c in frames))


SITE = "/usr/local/lib/python3.12/dist-packages/"


@pytest.mark.parametrize(
    "thread,kind",
    [
        (t(("Event.synchronize", SITE + "torch/cuda/streams.py", "")), "gpu_wait"),
        (t(("synchronize", SITE + "torch/cuda/__init__.py", "")), "gpu_wait"),
        (t(("Stream.synchronize", SITE + "torch/cuda/streams.py", "")), "gpu_wait"),
        (t(("barrier", SITE + "torch/distributed/distributed_c10d.py", "")), "gpu_wait"),
        # .item() / .tolist() / .cpu() are C methods: py-spy's innermost Python frame is the caller's line
        (
            t(("forward_batch_generation", SITE + "sglang/srt/managers/tp_worker.py", "next_token_ids.tolist()")),
            "gpu_wait",
        ),
        (
            t(("verify", SITE + "sglang/srt/speculative/eagle_worker.py", "accept_length = accept.sum().item()")),
            "gpu_wait",
        ),
        (t(("process", SITE + "sglang/srt/x.py", "logits = logits.cpu()")), "gpu_wait"),
        # compilers: progress, even when the autotuner synchronizes to time a kernel
        (
            t(
                ("synchronize", SITE + "torch/cuda/__init__.py", ""),
                ("benchmark_gpu", SITE + "torch/_inductor/runtime/benchmarking.py", ""),
            ),
            "compile",
        ),
        (t(("compile", SITE + "triton/compiler/compiler.py", "")), "compile"),
        (t(("build", SITE + "deep_gemm/jit/compiler.py", "")), "compile"),
        (t(("_jit_compile", SITE + "torch/utils/cpp_extension.py", "")), "compile"),
        (t(("load_module", SITE + "flashinfer/jit/core.py", "")), "compile"),
        # a thread py-spy woke in a Python-level wait sleeps; plain Python work is working
        (t(("Condition.wait", "/usr/lib/python3.12/threading.py", "")), "idle"),
        (t(("tokenize", SITE + "sglang/srt/managers/tokenizer_manager.py", "ids = tok(text)")), "working"),
        (t(), "working"),
    ],
)
def test_thread_kind(thread: BusyThread, kind: str) -> None:
    assert thread_kind(thread) == kind


def sample(*threads: BusyThread, error: str = "") -> BusySample:
    return BusySample(at=0.0, pids=(1,), threads=threads, error=error)


WAIT = t(("Event.synchronize", "torch/cuda/streams.py", ""))
WORK = t(("tokenize", "sglang/x.py", ""))
IDLE = t(("wait", "/usr/lib/python3.12/threading.py", ""))


def test_sample_kind() -> None:
    recorded = parse_active_threads(1, (FIXTURES / "sim-busy-capture-pyspy.txt").read_text())
    assert sample_kind(sample(*recorded)) == "gpu_wait"
    compiling = parse_active_threads(1, (FIXTURES / "sim-long-compile-pyspy.txt").read_text())
    assert sample_kind(sample(*compiling)) == "compile"
    assert sample_kind(sample(WAIT, IDLE)) == "gpu_wait"
    assert sample_kind(sample(WAIT, WORK)) == "working"  # one thread really works: not a pure wait
    assert sample_kind(sample(IDLE)) == "none"
    assert sample_kind(sample(error="py-spy not found")) == "error"


def gpu(util: float, *, held_on: tuple[int, ...] = (0,), n: int = 1) -> GpuObservation:
    return GpuObservation(
        status="ok",
        reason="",
        devices=tuple(GpuDevice(i, f"GPU-{i}", "H200", util, 0, 140 * GB) for i in range(n)),
        processes=tuple(GpuProcess(100, i, f"GPU-{i}", GB) for i in held_on),
    )


def gpm(*sm: float) -> GpmObservation:
    return GpmObservation(
        status="ok", reason="", devices=tuple(GpmDevice(i, f"GPU-{i}", v, 0.0) for i, v in enumerate(sm))
    )


@pytest.mark.parametrize(
    "util,sm,spinning",
    [
        (100.0, 0.0076, True),  # the H200 hang: one kernel spinning
        (25.0, 0.041, False),  # the tiny model serving 8 clients
        (0.0, 0.0, False),  # idle
        (100.0, 0.45, False),  # a real model at work
    ],
)
def test_gpu_spinning_on_the_issues_readings(util: float, sm: float, spinning: bool) -> None:
    assert gpu_spinning(gpu(util), gpm(sm), S.busy_gpu_percent, S.gpm_spin_sm_active) is spinning


def test_gpu_spinning_needs_gpm_and_looks_at_the_trees_gpus() -> None:
    assert not gpu_spinning(gpu(100.0), GpmObservation("unavailable", "MIG"), 50.0, 0.02)
    # GPU 1 (not the tree's) works hard; GPU 0 (the tree's) spins: a spin
    assert gpu_spinning(gpu(100.0, n=2), gpm(0.005, 0.9), 50.0, 0.02)
    # both GPUs are the tree's and one works: not a spin of the tree
    assert not gpu_spinning(gpu(100.0, n=2, held_on=(0, 1)), gpm(0.005, 0.9), 50.0, 0.02)
    # NVML attributes nothing (a container without the host pid namespace): every GPU counts
    assert gpu_spinning(gpu(100.0, n=2, held_on=()), gpm(0.005, 0.01), 50.0, 0.02)


def test_runs_of_looks() -> None:
    b = BusyState(kinds=("gpu_wait", "none", "gpu_wait", "error", "gpu_wait"), waits_in="x")
    assert gpu_bound(b, 0.0, S).startswith("py-spy: 3 looks")
    assert gpu_bound(replace(b, kinds=("gpu_wait", "gpu_wait", "working", "gpu_wait", "gpu_wait")), 0.0, S) == ""
    assert gpu_bound(replace(b, kinds=("gpu_wait", "gpu_wait")), 0.0, S) == ""
    # GPM held for the window, unless the last look found a compiler
    assert gpu_bound(BusyState(spin_since=0.0), 60.0, S).startswith("GPM")
    assert gpu_bound(BusyState(spin_since=0.0), 59.0, S) == ""
    assert gpu_bound(BusyState(spin_since=0.0, kinds=("compile",)), 60.0, S) == ""


def test_looks_start_at_half_the_window_while_only_cpu_moves() -> None:
    assert not wants_look(29.0, 1.0, S)
    assert wants_look(30.0, 1.0, S)
    assert not wants_look(70.0, 61.0, S)  # nothing moves at all: the plain stall rule needs no look


def test_strong_progress_starts_a_new_run() -> None:
    o = replace(obs(10.0), busy=sample(WAIT))
    b = fold_busy(BusyState(), o, 10.0, False, S)
    assert b.kinds == ("gpu_wait",) and "Event.synchronize" in b.waits_in
    assert fold_busy(b, o, 12.0, True, S).kinds == ()


# -- through the watchdog -------------------------------------------------------------------------


def spin_seq(t_end: float, *, step: float = 2.0, looks: str | None = None, gpm_sm: float | None = None) -> list:  # type: ignore[type-arg]
    """A capture that logged its last line at t=10, then only CPU moves (one core)."""
    out = [obs(10.0, cpu=10.0, lines=20, phase="capturing_graphs", line_at=10.0)]
    t_ = 12.0
    while t_ <= t_end:
        o = obs(t_, cpu=t_, lines=20, phase="capturing_graphs", gpu_util=100.0 if gpm_sm is not None else 0.0)
        if gpm_sm is not None:
            o = replace(o, gpm=gpm(gpm_sm))
        if looks is not None and t_ - 10.0 >= S.startup_stall_s / 2:
            kind = {"wait": WAIT, "compile": t(("compile", "triton/compiler/compiler.py", ""))}[looks]
            o = replace(o, busy=sample(kind))
        out.append(o)
        t_ += step
    return out


def run(seq: list, h: History | None = None):  # type: ignore[no-untyped-def, type-arg]
    h = h or new_history(0.0)
    for o in seq:
        v, h = assess(h, o, o.at, S, mode="starting")
        if v.is_incident:
            return v, h
    return v, h


def test_gpm_spin_is_a_stall_at_the_window_not_at_cpu_only() -> None:
    v, _ = run(spin_seq(1000.0, gpm_sm=0.0076))
    assert v.cause == "startup_stall" and v.stall_class == "busy"
    since = dict(v.figures)["since_progress_s"]
    assert S.startup_stall_s <= since <= S.startup_stall_s + 2 * S.poll_interval_s
    assert "waits on the GPU (GPM: GPU busy, SM activity 0.76% (floor 2%)" in v.reason
    assert dict(v.figures)["gpm_sm_active_ratio"] == 0.0076


def test_py_spy_waits_are_a_stall_at_the_window() -> None:
    v, _ = run(spin_seq(1000.0, looks="wait"))
    assert v.cause == "startup_stall" and "py-spy: 3 looks" in v.reason
    assert dict(v.figures)["since_progress_s"] <= S.startup_stall_s + 2 * S.poll_interval_s


def test_compile_looks_keep_the_cpu_as_progress_until_the_backstop() -> None:
    v, _ = run(spin_seq(800.0, looks="compile", gpm_sm=0.0076))  # even with a GPU that reads as spinning
    assert not v.is_incident, v
    v, _ = run(spin_seq(1000.0, looks="compile"))
    assert v.cause == "startup_stall" and dict(v.figures)["since_progress_s"] >= S.cpu_only_stall_s


def test_serving_gpu_is_not_a_spin_and_no_gpm_falls_back_to_cpu_only() -> None:
    v, _ = run(spin_seq(800.0, gpm_sm=0.04))  # util 100 %, SM 4 %: working
    assert not v.is_incident
    v, _ = run(spin_seq(1000.0))  # no GPM, no looks: today's rule
    assert v.cause == "startup_stall" and dict(v.figures)["since_progress_s"] >= S.cpu_only_stall_s
