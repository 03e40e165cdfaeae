"""On a real GPU: the NVML probe attributes the scheduler's memory; an idle and a busy hang are detected,
classified, captured with native stacks and an NVML snapshot; the stop gives the memory back.

Each test loads tens of GB through `bench/gpuserver` (at most half of the free GPU memory) under the
daemon, in-process, with short windows. Skipped without a GPU (see conftest.py).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from bench.gpuserver.harness import HangResult, RunConfig, run_hang, run_serve
from bench.gpuserver.measure import RELEASE_SLACK_BYTES

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("gpu"), pytest.mark.timeout(600)]

RC = RunConfig()
# A native frame in py-spy's --native dump: `PyThread_acquire_lock_timed (libpython3.12.so.1.0)`.
NATIVE_FRAME = re.compile(r"^ {4}\S.* \([^:()]+\)$", re.M)


def _released(r: HangResult) -> None:
    """The daemon verified the release, and the device itself is back where it was before the launch."""
    stop = r.stopped
    assert stop["survivors"] == [] and stop["gpu_released"] is True and stop["gpu_held_bytes"] == 0, stop
    assert r.release.released_at is not None, "NVML never showed the memory free after the processes died"
    assert r.device_after_bytes is not None and r.baseline_bytes is not None
    assert r.device_after_bytes <= r.baseline_bytes + RELEASE_SLACK_BYTES


def _evidence(r: HangResult) -> int:
    """Native stacks and the NVML snapshot in the bundle; returns the scheduler's pid."""
    sched = int(r.status["scheduler_pid"])
    assert r.bundle_dir is not None and (r.bundle_dir / "summary.json").exists()
    native = r.file(f"pyspy-native-{sched}.txt")
    assert NATIVE_FRAME.search(native), native[:2000]
    gdb = r.tool(sched, "cuda-gdb") or r.tool(sched, "gdb")
    assert gdb is not None, r.tools
    assert r.nvml_pids.get(sched, 0) >= 0.95 * r.status["allocated_bytes"], (r.nvml_pids, r.status)
    return sched


async def test_serving_tree_holds_its_gpu_memory_in_nvml_and_status(tmp_path: Path) -> None:
    r = await run_serve(tmp_path, RC, calls=20)
    sched, allocated = int(r.status["scheduler_pid"]), r.status["allocated_bytes"]
    assert allocated >= 4 * 1024**3
    assert r.nvml_pids.get(sched, 0) >= 0.95 * allocated, r.nvml_pids
    gpu = r.api_status["gpu"]
    assert r.api_status["state"] == "ready" and gpu["status"] == "ok"
    assert gpu["tree_mem_bytes"] >= 0.95 * allocated and gpu["devices"][0]["tree_mem_bytes"] >= 0.95 * allocated
    assert r.cost.p50_ms < 50
    assert r.stopped["gpu_released"] is True and r.stopped["survivors"] == []
    assert r.release_s is not None, "the device did not come back to its baseline after the stop"


async def test_idle_deadlock_after_load_is_found_classified_and_released(tmp_path: Path) -> None:
    r = await run_hang(tmp_path, "deadlock", RC)
    assert r.cause == "startup_stall" and r.hang_class == "idle_deadlock", (r.cause, r.hang_class, r.reason)
    assert r.detect_s is not None and RC.stall_s - 0.5 <= r.detect_s <= RC.stall_s + 2 * RC.poll_s + 1.5
    sched = _evidence(r)
    assert "_sync_weights_to_graph_pool" in r.file(f"pyspy-native-{sched}.txt")
    gdb = r.tool(sched, "cuda-gdb") or r.tool(sched, "gdb")
    assert gdb is not None and gdb["outcome"] == "ok", gdb
    assert re.search(r"^#0\s", r.file(f"gdb-{sched}.txt"), re.M)
    assert (r.summary["figures"]["gpu_util_percent"] or 0) < 50
    _released(r)


async def test_gpu_kernel_spinning_on_a_flag_is_a_busy_spin_and_released(tmp_path: Path) -> None:
    r = await run_hang(tmp_path, "spin", RC)
    assert r.cause == "startup_stall" and r.hang_class == "busy_spin", (r.cause, r.hang_class, r.reason)
    window = RC.cpu_only_stall_s + 2 * RC.poll_s + 1.5
    assert r.detect_s is not None and RC.cpu_only_stall_s - 0.5 <= r.detect_s <= window
    assert r.summary["figures"]["gpu_util_percent"] >= 50, r.summary["figures"]
    sched = _evidence(r)
    assert "_wait_for_peer_flag" in r.file(f"pyspy-native-{sched}.txt")
    _released(r)
