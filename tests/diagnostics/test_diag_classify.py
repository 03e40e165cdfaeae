"""Table tests of the pure classifier on real dumps (deadlock-*, busy-*) and synthetic SGLang shapes."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from probes.types import ThreadInfo
from supervisor.diagnostics import Evidence, Frame, ProcEvidence, StackThread, classify
from supervisor.diagnostics.tools import parse_cuda_kernels, parse_gdb, parse_py_spy

FIX = Path(__file__).parent / "fixtures"


def read(name: str) -> str:
    return (FIX / name).read_text()


# /proc samples as they were when the real fixtures were captured (tids from the dumps).
DEADLOCK_SAMPLE = (
    ThreadInfo(6698, "python", "S", "futex_do_wait"),
    ThreadInfo(6700, "python", "S", "hrtimer_nanosleep"),
    ThreadInfo(6702, "python", "S", "futex_do_wait"),
    ThreadInfo(6703, "python", "S", "futex_do_wait"),
)
BUSY_SAMPLE = (ThreadInfo(6876, "python", "R", "0"),)


def deadlock(**kw: object) -> ProcEvidence:
    base = ProcEvidence(
        6698,
        "scheduler",
        0,
        "sglang::scheduler_TP0",
        (DEADLOCK_SAMPLE, DEADLOCK_SAMPLE),
        python=parse_py_spy(read("deadlock-pyspy.txt")),
    )
    return replace(base, **kw)  # type: ignore[arg-type]


def busy(**kw: object) -> ProcEvidence:
    base = ProcEvidence(
        6876, "scheduler", 1, "", (BUSY_SAMPLE, BUSY_SAMPLE), python=parse_py_spy(read("busy-pyspy.txt"))
    )
    return replace(base, **kw)  # type: ignore[arg-type]


def collective_pyspy() -> ProcEvidence:
    return ProcEvidence(4242, "scheduler", 1, python=parse_py_spy(read("synthetic-collective-pyspy-native.txt")))


def collective_gdb() -> ProcEvidence:
    text = read("synthetic-collective-cuda-gdb.txt")
    return ProcEvidence(4242, "scheduler", 1, native=parse_gdb(text), gpu_kernels=parse_cuda_kernels(text))


def graph_capture() -> ProcEvidence:
    return ProcEvidence(5151, "scheduler", 0, python=parse_py_spy(read("synthetic-graph-capture-pyspy.txt")))


def nccl_helpers_only() -> tuple[StackThread, ...]:
    return tuple(t for t in collective_gdb().native if t.tid != 4242)


def one_thread(frames: tuple[Frame, ...], state: str, status: str = "idle", wchan: str = "0") -> ProcEvidence:
    info = ThreadInfo(10, "python", state, wchan)
    return ProcEvidence(
        10,
        "scheduler",
        0,
        samples=((info,), (info,)),
        python=(StackThread(10, "MainThread", frames, status),),
    )


IO_SAMPLES = (
    (ThreadInfo(20, "python", "D", "folio_wait_bit"), ThreadInfo(21, "python", "S", "futex_do_wait")),
    (ThreadInfo(20, "python", "D", "folio_wait_bit"), ThreadInfo(21, "python", "S", "futex_do_wait")),
)
REPLAY = (
    Frame("CudaGraphRunner.replay", "sglang/srt/model_executor/cuda_graph_runner.py", 812),
    Frame("ModelRunner.forward_decode", "sglang/srt/model_executor/model_runner.py", 1577),
)
THREADING_BARRIER = (Frame("Barrier.wait", "threading.py", 707), Frame("worker", "app.py", 3))
TORCH_BARRIER = (Frame("barrier", "torch/distributed/distributed_c10d.py", 4170), Frame("init", "app.py", 9))
EPOLL = (Frame("EpollSelector.select", "selectors.py", 468), Frame("serve", "app.py", 5))

# Threads every torch.distributed process has, seen on the H200 (torch 2.11): the TCPStore daemon and
# gloo's work thread between collectives. They wait by design and say nothing about a hang.
TCPSTORE = StackThread(
    77, "pt_tcpstore_uv", (Frame("uv_run", "libuv.so"), Frame("c10d::detail::LibUVStoreDaemon::run", "libtorch_cpu.so"))
)
GLOO_IDLE = StackThread(
    78,
    "pt_gloo_runloop",
    (
        Frame("std::condition_variable::wait", "libstdc++.so.6"),
        Frame("c10d::ProcessGroupGloo::runLoop", "libtorch_cpu.so"),
    ),
)
GLOO_BUSY = StackThread(
    78,
    "pt_gloo_runloop",
    (
        Frame("gloo::transport::tcp::UnboundBuffer::waitRecv", "libtorch_cpu.so"),
        Frame("c10d::(anonymous namespace)::AsyncAllreduceWork::allreduce", "libtorch_cpu.so"),
        Frame("c10d::ProcessGroupGloo::runLoop", "libtorch_cpu.so"),
    ),
)

CASES: list[tuple[str, Evidence, str]] = [
    (
        "lock deadlock in a torch.distributed process: the TCPStore daemon is not a collective",
        Evidence((deadlock(native=(TCPSTORE,)),), tree_cpu_cores=0.0, gpu_util_percent=0.0),
        "idle_deadlock",
    ),
    (
        "lock deadlock beside gloo's idle work thread",
        Evidence((deadlock(native=(GLOO_IDLE,)),), tree_cpu_cores=0.0),
        "idle_deadlock",
    ),
    ("gloo's work thread inside an all-reduce", Evidence((deadlock(native=(GLOO_BUSY,)),)), "collective"),
    (
        "real deadlock, py-spy + /proc",
        Evidence((deadlock(),), tree_cpu_cores=0.0, gpu_util_percent=0.0),
        "idle_deadlock",
    ),
    (
        "real deadlock, py-spy --native only",
        Evidence((deadlock(samples=(), python=parse_py_spy(read("deadlock-pyspy-native.txt"))),)),
        "idle_deadlock",
    ),
    (
        "real deadlock, gdb only",
        Evidence((deadlock(samples=(), python=(), native=parse_gdb(read("deadlock-gdb.txt"))),)),
        "idle_deadlock",
    ),
    (
        "real deadlock, NCCL helper threads waiting too",
        Evidence((deadlock(native=nccl_helpers_only()),)),
        "idle_deadlock",
    ),
    ("real deadlock but the tree burns CPU", Evidence((deadlock(),), tree_cpu_cores=1.2), "busy_spin"),
    ("real deadlock but a GPU is busy", Evidence((deadlock(),), gpu_util_percent=98.0), "busy_spin"),
    (
        "real deadlock stalled in graph capture phase",
        Evidence((deadlock(),), phase="capturing_graphs"),
        "cuda_graph_capture",
    ),
    ("real busy spin, R in two samples", Evidence((busy(),)), "busy_spin"),
    ("real busy spin, one sample only, no figures", Evidence((busy(samples=(BUSY_SAMPLE,)),)), "unknown"),
    (
        "real busy spin, one sample, CPU figure",
        Evidence((busy(samples=(BUSY_SAMPLE,)),), tree_cpu_cores=1.0),
        "busy_spin",
    ),
    (
        "synthetic all_reduce py-spy, GPU 100 %",
        Evidence((collective_pyspy(),), gpu_util_percent=100.0),
        "collective",
    ),
    ("synthetic cuda-gdb in cudaStreamSynchronize + ncclKernel", Evidence((collective_gdb(),)), "collective"),
    (
        "synthetic collective rank beside a deadlocked rank",
        Evidence((deadlock(), collective_pyspy())),
        "collective",
    ),
    (
        "synthetic graph capture inside all_reduce",
        Evidence((graph_capture(),), gpu_util_percent=100.0),
        "cuda_graph_capture",
    ),
    (
        "graph replay while serving is not capture",
        Evidence((one_thread(REPLAY, "R", "active+gil"),)),
        "busy_spin",
    ),
    (
        "threading.Barrier is not a collective",
        Evidence((one_thread(THREADING_BARRIER, "S", wchan="futex_do_wait"),)),
        "idle_deadlock",
    ),
    (
        "torch.distributed.barrier is",
        Evidence((one_thread(TORCH_BARRIER, "S", wchan="futex_do_wait"),)),
        "collective",
    ),
    ("main thread in D state", Evidence((ProcEvidence(20, "scheduler", 0, samples=IO_SAMPLES),)), "io_wait"),
    (
        "D state beats busy figures",
        Evidence((ProcEvidence(20, samples=IO_SAMPLES),), tree_cpu_cores=2.0),
        "io_wait",
    ),
    (
        "collective beats D state",
        Evidence((ProcEvidence(20, samples=IO_SAMPLES), collective_pyspy())),
        "collective",
    ),
    ("only epoll waits", Evidence((one_thread(EPOLL, "S", wchan="ep_poll"),)), "unknown"),
    ("nothing at all", Evidence(()), "unknown"),
]


@pytest.mark.parametrize(("name", "evidence", "expected"), CASES, ids=[c[0] for c in CASES])
def test_classification_table(name: str, evidence: Evidence, expected: str) -> None:
    result = classify(evidence)
    assert result.hang_class == expected, result.reasons
    assert result.reasons
    assert result.candidates[0] == expected


def test_idle_deadlock_names_both_threads_and_their_lines() -> None:
    result = classify(Evidence((deadlock(),), tree_cpu_cores=0.0, gpu_util_percent=0.0))
    text = "\n".join(result.frames)
    assert "thread 'weights-sync'" in text and "deadlock_prog.py:25 (take_a_then_b)" in text
    assert "thread 'graph-pool'" in text and "deadlock_prog.py:31 (take_b_then_a)" in text
    assert "heartbeat" not in text  # it sleeps; it is not part of the deadlock
    assert any("tree CPU 0.00 cores" in r for r in result.reasons)


def test_collective_names_the_python_call_and_the_kernel() -> None:
    pyspy = classify(Evidence((collective_pyspy(),)))
    assert any("all_reduce (torch/distributed/distributed_c10d.py:2501)" in f for f in pyspy.frames)
    gdb = classify(Evidence((collective_gdb(),)))
    assert any("ncclDevKernel_AllReduce" in f for f in gdb.frames)
    assert not any("pt_nccl_watchdg" in f for f in gdb.frames)


def test_precedence_is_reported() -> None:
    result = classify(Evidence((graph_capture(),), gpu_util_percent=100.0))
    assert result.candidates == ("cuda_graph_capture", "collective", "busy_spin")
    assert any("capture_one_batch_size" in f for f in result.frames)
    assert any("also matched" in r for r in result.reasons)


def test_busy_names_the_looping_line() -> None:
    result = classify(Evidence((busy(),)))
    assert any("runs in spin_forever at deadlock_prog.py:54" in f for f in result.frames)


def test_samples_taken_while_our_tools_held_the_process_are_ignored() -> None:
    traced = tuple(ThreadInfo(t.tid, t.name, "t", "ptrace_stop") for t in DEADLOCK_SAMPLE)
    evidence = Evidence((deadlock(samples=(DEADLOCK_SAMPLE, traced)),))
    result = classify(evidence)
    assert result.hang_class == "idle_deadlock"
    assert "ptrace_stop" not in "\n".join(result.frames)


def test_collective_names_the_rank_the_others_wait_for() -> None:
    tp0 = replace(collective_pyspy(), pid=100, rank=0)
    tp2 = replace(collective_pyspy(), pid=102, rank=2)
    tp1 = deadlock(pid=101, rank=1, samples=())  # elsewhere: waits on a lock, not in the all-reduce
    c = classify(Evidence((tp0, tp1, tp2)))
    assert c.hang_class == "collective"
    assert any("TP0, TP2 wait in the collective" in r and "TP1 (pid 101) never joined" in r for r in c.reasons)
    alone = classify(Evidence((tp0, tp2)))
    assert not any("never joined" in r for r in alone.reasons)


STOPPED_SAMPLE = (ThreadInfo(300, "python", "T", "do_signal_stop"), ThreadInfo(301, "python", "T", "do_signal_stop"))
FRONT_SAMPLE = (ThreadInfo(200, "python", "R", "0"),)


def front_end(**kw: object) -> ProcEvidence:
    """The HTTP main process spinning its core for the clients, as real SGLang's did."""
    base = ProcEvidence(200, "main", None, "python3 -m sglang.launch_server", (FRONT_SAMPLE, FRONT_SAMPLE))
    return replace(base, **kw)  # type: ignore[arg-type]


def stopped_rank(pid: int = 300, rank: int = 0) -> ProcEvidence:
    return ProcEvidence(
        pid, "scheduler", rank, "sglang::scheduler", (STOPPED_SAMPLE, STOPPED_SAMPLE), stopped=True, cpu_cores=0.0
    )


def test_a_stopped_rank_is_named_and_the_front_ends_core_does_not_make_it_busy() -> None:
    ev = Evidence((front_end(cpu_cores=1.0), stopped_rank()), tree_cpu_cores=1.0, gpu_util_percent=0.0)
    c = classify(ev)
    assert c.hang_class == "idle_deadlock", c.reasons
    assert c.reasons[0].startswith("scheduler TP0 pid 300 stopped (state T")
    assert "scheduler TP0 pid 300: stopped (state T)" in c.frames


def test_the_same_core_in_a_scheduler_is_busy() -> None:
    spinning = busy(cpu_cores=1.0)
    c = classify(Evidence((front_end(cpu_cores=0.0), spinning), tree_cpu_cores=1.0))
    assert c.hang_class == "busy_spin"
    assert any(r.startswith("schedulers' CPU 1.00 cores") for r in c.reasons)


def test_without_schedulers_the_tree_cpu_still_decides() -> None:
    c = classify(Evidence((front_end(),), tree_cpu_cores=1.0))
    assert c.hang_class == "busy_spin" and any(r.startswith("tree CPU 1.00") for r in c.reasons)


def test_a_stopped_rank_is_the_one_the_collective_waits_for() -> None:
    tp0 = replace(collective_pyspy(), pid=100, rank=0, cpu_cores=1.0)
    c = classify(Evidence((tp0, stopped_rank(pid=101, rank=1))))
    assert c.hang_class == "collective"
    assert c.reasons[0].startswith("scheduler TP1 pid 101 stopped")
    assert any("TP1 (pid 101) never joined" in r for r in c.reasons)


def test_a_tool_stop_is_not_a_signal_stop() -> None:
    # Not stopped before the capture: T samples are our own tools' and are dropped as before.
    traced = tuple(replace(t, state="T") for t in DEADLOCK_SAMPLE)
    c = classify(Evidence((deadlock(samples=(DEADLOCK_SAMPLE, traced)),)))
    assert c.hang_class == "idle_deadlock" and not any("stopped" in r for r in c.reasons)
