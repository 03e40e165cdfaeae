from __future__ import annotations

from pathlib import Path

import pytest

from supervisor.diagnostics import tools

FIX = Path(__file__).parent / "fixtures"


def read(name: str) -> str:
    return (FIX / name).read_text()


def test_py_spy_dump_of_the_real_deadlock() -> None:
    threads = {t.name: t for t in tools.parse_py_spy(read("deadlock-pyspy.txt"))}
    assert set(threads) == {"MainThread", "heartbeat", "weights-sync", "graph-pool"}
    top = threads["weights-sync"].frames[0]
    assert (top.function, top.file, top.line) == ("take_a_then_b", "deadlock_prog.py", 25)
    assert threads["graph-pool"].frames[0].line == 31
    assert threads["weights-sync"].status == "idle"
    assert all(t.tid is not None for t in threads.values())


def test_py_spy_native_frames_precede_python_ones() -> None:
    threads = {t.name: t for t in tools.parse_py_spy(read("deadlock-pyspy-native.txt"))}
    names = [f.function for f in threads["weights-sync"].frames]
    assert names.index("PyThread_acquire_lock_timed") < names.index("take_a_then_b")
    assert not threads["weights-sync"].frames[0].is_python


def test_py_spy_busy_thread_is_active() -> None:
    (main,) = tools.parse_py_spy(read("busy-pyspy.txt"))
    assert main.status == "active+gil"
    assert main.frames[0].function == "spin_forever"


def test_py_spy_cpp_frames_with_parentheses_in_the_name() -> None:
    main = tools.parse_py_spy(read("synthetic-collective-pyspy-native.txt"))[0]
    names = [f.function for f in main.frames]
    assert "c10d::ops::(anonymous namespace)::allreduce_CUDA" in names
    assert any(
        f.function == "all_reduce" and f.file == "torch/distributed/distributed_c10d.py" for f in main.frames
    )


def test_gdb_trace_of_the_real_deadlock() -> None:
    threads = tools.parse_gdb(read("deadlock-gdb.txt"))
    assert len(threads) == 4
    assert all(t.tid is not None and t.name == "python" for t in threads)
    locked = [t for t in threads if any(f.function == "lock_PyThread_acquire_lock" for f in t.frames)]
    assert len(locked) == 3  # two deadlocked workers and the main thread joining them
    first = threads[0].frames[0]
    assert first.function == "__futex_abstimed_wait_common64"
    assert first.file.endswith("futex-internal.c") and first.line == 57


def test_gdb_cpp_frames_and_cuda_kernels() -> None:
    text = read("synthetic-collective-cuda-gdb.txt")
    threads = {t.tid: t for t in tools.parse_gdb(text)}
    main = threads[4242]
    names = [f.function for f in main.frames]
    assert "cudaStreamSynchronize" in names
    assert "c10d::ProcessGroupNCCL::WorkNCCL::synchronizeStream" in names
    assert threads[4260].name == "pt_nccl_watchdg"
    assert tools.parse_cuda_kernels(text) == ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL",)


def test_py_spy_argv_never_asks_for_locals() -> None:
    argv = tools.py_spy_argv("/x/py-spy", 12, native=True, nonblocking=True)
    assert argv == ("/x/py-spy", "dump", "--pid", "12", "--native", "--nonblocking")
    assert "--locals" not in tools.py_spy_argv("/x/py-spy", 12, native=False, nonblocking=False)


def test_gdb_argv_is_batch_and_offline() -> None:
    argv = tools.gdb_argv("/usr/bin/gdb", 7, "gdb")
    assert argv[:5] == ("/usr/bin/gdb", "-p", "7", "--batch", "-nx")
    assert "thread apply all bt" in argv and "set debuginfod enabled off" in argv
    assert "info cuda kernels" not in argv
    assert tools.gdb_argv("/cuda/bin/cuda-gdb", 7, "cuda-gdb")[-1] == "info cuda kernels"
    assert "set auto-solib-add off" not in tools.gdb_argv("/usr/bin/gdb", 7, "gdb")
    fast = tools.gdb_argv("/cuda/bin/cuda-gdb", 7, "cuda-gdb", shared_symbols=False)
    assert fast[fast.index("set auto-solib-add off") - 1] == "-iex"  # before the attach reads them


def test_cuda_kernel_names_with_spaces_and_parentheses() -> None:
    """`info cuda kernels` as cuda-gdb printed it on the H200 for torch's spin kernel, and NCCL's row."""
    text = (
        "  Kernel Parent Dev Grid Status                             SMs Mask GridDim BlockDim Invocation\n"
        "*      0      -   0    4 Active 0x0010000000000000000000000000000000 (1,1,1)  (1,1,1) "
        "at::cuda::(anonymous namespace)::spin_kernel() \n"
        "       1      -   0    7 Active 0x00ff (24,1,1) (640,1,1) "
        "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)\n"
        "0x00007fc6db7a00b0 in at::cuda::(anonymous namespace)::spin_kernel(long)<<<(1,1,1),(1,1,1)>>> ()\n"
        "[Switching focus to CUDA kernel 0, grid 4, block (0,0,0), thread (0,0,0), device 0, sm 124]\n"
    )
    assert tools.parse_cuda_kernels(text) == (
        "at::cuda::(anonymous namespace)::spin_kernel",
        "ncclDevKernel_AllReduce_Sum_f32_RING_LL",
    )


@pytest.mark.parametrize(
    ("tool", "code", "out", "err", "expected"),
    [
        ("py-spy", 0, 'Thread 1 (idle): "MainThread"\n', "", "ok"),
        ("py-spy", 1, "", "Error: Permission denied (os error 13)", "denied"),
        ("py-spy", 1, "", "Error: Operation not permitted (os error 1)", "denied"),
        ("py-spy", 1, "", "Permission Denied: Try running again with elevated permissions", "denied"),
        (
            "py-spy",
            1,
            "",
            "Error: Failed to get process executable name. Check that the process is running.",
            "gone",
        ),
        ("py-spy", 1, "", "Error: Failed to find python version from target process", "failed"),
        ("gdb", 0, 'Thread 1 (LWP 5 "x"):\n#0  0x1 in f () from libc.so.6\n', "", "ok"),
        ("gdb", 1, "", "ptrace: Operation not permitted.", "denied"),
        ("gdb", 1, "", "ptrace: No such process.", "gone"),
        ("cuda-gdb", 1, "", "something else", "failed"),
    ],
)
def test_judge(tool: tools.ToolName, code: int, out: str, err: str, expected: str) -> None:
    assert tools.judge(tool, code, out, err) == expected


def test_configured_paths_win_and_missing_ones_are_none(tmp_path: Path) -> None:
    assert tools.find_py_spy(str(tmp_path / "nope")) is None
    fake = tmp_path / "cuda-gdb"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    assert tools.find_gdb(str(fake)) == (str(fake), "cuda-gdb")
    assert tools.find_gdb(str(tmp_path / "gdb")) == (None, "gdb")


def test_cuda_gdb_serves_when_gdb_is_absent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = tmp_path / "cuda-gdb"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert tools.find_gdb(None) == (str(fake), "cuda-gdb")
