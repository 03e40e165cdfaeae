"""Start-up hangs are real hangs, and long loads really keep moving."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import psutil
import pytest

from probes.starvation import StarvationProbe

if TYPE_CHECKING:
    from conftest import Sim, SimStarter

pytestmark = pytest.mark.integration

PY_SPY = str(Path(sys.executable).with_name("py-spy"))


def py_spy(pid: int, native: bool = False) -> str:
    argv = [PY_SPY, "dump", "--pid", str(pid), *(["--native"] if native else [])]
    return subprocess.run(argv, capture_output=True, text=True, timeout=30).stdout


def runnable_s(pids: list[int], seconds: float) -> float:
    """Seconds the threads of `pids` ran or sat runnable waiting for a CPU over `seconds` of wall
    time: what a spin costs whatever the machine's load (on a busy CI host the run-queue wait
    takes what the CPU time alone would have shown)."""
    probe = StarvationProbe()
    first = probe.observe(pids)
    time.sleep(seconds)
    second = probe.observe(pids)
    assert first.available and second.available
    return (second.on_cpu_s - first.on_cpu_s) + (second.run_wait_s - first.run_wait_s)


def tree_counters(s: Sim) -> tuple[float, int]:
    """CPU seconds and bytes read by the whole tree."""
    cpu, rchar = 0.0, 0
    for proc in [psutil.Process(s.proc.pid), *s.children()]:
        try:
            t = proc.cpu_times()
            cpu += t.user + t.system
            rchar += proc.io_counters().read_chars
        except psutil.Error:
            continue
    return cpu, rchar


def test_deadlock_after_load_is_a_real_deadlock(sim: SimStarter) -> None:
    s = sim("deadlock_after_load", tp=2)
    assert s.wait_log("] KV Cache is allocated.", count=2)
    time.sleep(0.3)
    before = s.stderr()
    assert "Load weight end." in before and "Memory pool end" not in before
    time.sleep(3)
    assert s.stderr() == before, "a deadlocked server printed something"
    assert not s.accepts()
    assert s.proc.poll() is None
    schedulers = s.schedulers()
    assert len(schedulers) == 2 and all(p.status() == psutil.STATUS_SLEEPING for p in schedulers)
    for proc in schedulers:
        assert proc.num_threads() >= 4  # main, NCCL-style watchdog, the two lock holders
        dump = py_spy(proc.pid, native=True)
        assert "_sync_weights_to_graph_pool" in dump and "_allocate_kv_pool" in dump, dump
        assert "acquire" in dump, dump  # both sit in a lock acquire
        assert '(idle): "weight-sync"' in dump and '(idle): "kv-pool-init"' in dump, dump
    onset = s.onset()
    assert onset["scenario"] == "deadlock_after_load" and onset["pid"] == s.proc.pid
    assert isinstance(onset["onset_monotonic"], float) and onset["onset_monotonic"] < time.monotonic() - 3
    cpu0, _ = tree_counters(s)
    time.sleep(1)
    cpu1, _ = tree_counters(s)
    assert cpu1 - cpu0 < 0.2  # idle: a few heartbeats, no spinning


def test_busy_hang_spins_one_thread(sim: SimStarter) -> None:
    s = sim("busy_hang_after_load", tp=1)
    assert s.wait_log("] KV Cache is allocated.")
    time.sleep(0.5)
    tp0 = s.schedulers()[0]
    assert runnable_s([tp0.pid], 1.0) > 0.6  # one thread spins: runnable most of every second
    dump = py_spy(tp0.pid)
    assert "_wait_for_peer_flag" in dump and re.search(r'\(active(\+gil)?\): "custom-all-reduce"', dump), dump
    assert not s.accepts()
    assert s.onset()["scenario"] == "busy_hang_after_load"


def test_unless_flag_turns_the_deadlock_off(sim: SimStarter) -> None:
    s = sim("deadlock_after_load", "--disable-cuda-graph", "--mystery-flag", "7", tp=1,
            env={"SGLANG_SIM_UNLESS": "disable-cuda-graph,cuda-graph-max-bs"})
    assert s.wait_log("The server is fired up and ready to roll!")
    assert "Capture cuda graph" not in s.stderr() and "Capturing batches" not in s.stderr()
    assert s.request("/health")[0] == 200
    onset = s.onset()
    assert onset["scenario"] == "ok" and onset["requested_scenario"] == "deadlock_after_load"
    assert onset["onset_wall"] is None and onset["unknown_flags"] == ["--mystery-flag", "7"]


def test_quiet_load_is_silent_but_busy(sim: SimStarter) -> None:
    s = sim("quiet_load", tp=1, env={"SGLANG_SIM_QUIET_S": "3"})
    assert s.wait_log("Load weight begin.")
    before = s.stderr()
    _, read0 = tree_counters(s)
    busy = runnable_s([s.proc.pid, *(c.pid for c in s.children())], 2.0)
    _, read1 = tree_counters(s)
    assert s.stderr() == before  # nothing printed
    assert busy > 0.2 and read1 - read0 > 4 * 1024 * 1024
    assert s.wait_log("The server is fired up and ready to roll!")  # then a normal start


def test_slow_load_crawls_while_reading(sim: SimStarter) -> None:
    s = sim("slow_load", tp=1, env={"SGLANG_SIM_SHARD_S": "1.5"})
    assert s.wait_log("Multi-thread loading shards:  12% Completed | 1/8")
    _, read0 = tree_counters(s)
    lines = s.stderr().count("\n")
    time.sleep(1.0)
    _, read1 = tree_counters(s)
    assert 1024 * 1024 <= read1 - read0 <= 8 * 1024 * 1024  # a slow filesystem: MB/s, steady
    assert s.stderr().count("\n") <= lines + 1
    assert s.wait_until(lambda: re.search(r"2/8 \[00:03<00:\d\d,  1\.5\ds/it\]", s.stderr()), 5)
    assert s.onset()["scenario"] == "slow_load"
