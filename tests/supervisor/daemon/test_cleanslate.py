"""The clean slate's readers and rules, on real files, real mappings and real orphan processes."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from orphans import spawn_orphan

from probes.types import GpuDevice, GpuObservation, GpuProcess
from supervisor.daemon import cleanslate as cs
from supervisor.process.stoppids import stop_pids


@pytest.mark.parametrize(
    ("name", "pid"),
    [
        ("sgl_shm_mq_4242_1a2b3c4d", 4242),
        ("sgl_shm_nodecheck_17_deadbeef", 17),
        ("multi_tokenizer_args_99", 99),
        ("sgl_shm_mq_0_1a2b3c4d", None),
        ("sglang_loads_x_ab12cd34.shm", None),
        ("psm_1a2b3c", None),
        ("sgl_shm_mq_notapid_1a", None),
    ],
)
def test_the_creator_pid_is_read_from_sglangs_names(name: str, pid: int | None) -> None:
    assert cs.creator_pid(name) == pid


def test_stale_means_sglangs_ours_unused_and_proven_ours() -> None:
    entries = [
        cs.ShmEntry("sgl_shm_mq_100_aa", 10, 0),  # creator dead, a pid of our tree
        cs.ShmEntry("sgl_shm_mq_101_aa", 10, 0),  # creator dead, never ours (another namespace?)
        cs.ShmEntry("sgl_shm_mq_102_cc", 10, 0),  # creator dead, our tree mapped it
        cs.ShmEntry("sgl_shm_mq_103_dd", 10, 0),  # creator dead, ours, but in use
        cs.ShmEntry("sgl_shm_mq_104_ee", 10, 1234),  # creator dead, ours, another user's
        cs.ShmEntry("sgl_shm_mq_200_bb", 10, 0),  # creator alive
        cs.ShmEntry("psm_abc", 10, 0),  # unused, our tree mapped it
        cs.ShmEntry("psm_abd", 10, 0),  # unused, never seen in our tree
        cs.ShmEntry("psm_def", 10, 0),  # ours, in use
        cs.ShmEntry("psm_fed", 10, 1234),  # another user's
        cs.ShmEntry("sglang_loads_m_ab.shm", 10, 0),  # unused, ours
        cs.ShmEntry("unrelated", 10, 0),  # not SGLang's name, even if "ours"
    ]
    ours = cs.OursShm(
        frozenset({100, 103, 104, 200}),
        frozenset({"sgl_shm_mq_102_cc", "psm_abc", "psm_def", "psm_fed", "sglang_loads_m_ab.shm", "unrelated"}),
    )
    stale = cs.stale_shm(
        entries, alive=lambda pid: pid == 200, in_use={"psm_def", "sgl_shm_mq_103_dd"}, uid=0, ours=ours
    )
    assert [s.name for s in stale] == ["sgl_shm_mq_100_aa", "sgl_shm_mq_102_cc", "psm_abc", "sglang_loads_m_ab.shm"]
    assert stale[0].why == "its creator pid 100 (of this daemon's tree) is gone"


def test_gpu_holders_outside_the_tree_on_the_servers_gpus() -> None:
    gpu = GpuObservation(
        status="ok",
        reason="",
        devices=(GpuDevice(0, "GPU-a", "H200", 0, 0, 1), GpuDevice(1, "GPU-b", "H200", 0, 0, 1)),
        processes=(GpuProcess(10, 0, "GPU-a", 5), GpuProcess(11, 1, "GPU-b", 6), GpuProcess(12, 0, "GPU-a", 7)),
    )
    got = cs.gpu_holders(gpu, exclude={12}, gpus=None, describe=lambda pid: f"cmd{pid}")
    assert got == [(10, 0, 5, "cmd10"), (11, 1, 6, "cmd11")]
    assert cs.gpu_holders(gpu, exclude=(), gpus={1}, describe=str) == [(11, 1, 6, "11")]
    assert cs.visible_gpus({"CUDA_VISIBLE_DEVICES": "1"}, gpu) == {1}
    assert cs.visible_gpus({"CUDA_VISIBLE_DEVICES": "GPU-b,0"}, gpu) == {0, 1}
    assert cs.visible_gpus({}, gpu) is None
    assert cs.visible_gpus({"CUDA_VISIBLE_DEVICES": "MIG-xyz"}, gpu) is None


def test_an_orphan_of_this_state_dir_is_found_and_stopped(tmp_path: Path) -> None:
    logs = tmp_path / "state" / "logs"
    logs.mkdir(parents=True)
    elsewhere = tmp_path / "other.log"
    ours = spawn_orphan(logs / "server.log")
    theirs = spawn_orphan(elsewhere, "sglang::scheduler_TP1")
    ours_vllm = spawn_orphan(logs / "server.log", "VLLM::Worker_TP1")  # a crossing ladder's vLLM rung
    other = spawn_orphan(logs / "server.log", "python3 some-tool")  # not an engine's title: never touched
    try:
        found = cs.orphans(tmp_path / "state", exclude=(), parents=(1, os.getpid()))
        assert ours in found and ours_vllm in found and theirs not in found and other not in found
        report = stop_pids([ours], grace_s=2.0)
        assert report.pids_found == (ours,) and report.survivors == () and report.termed == (ours,)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and cs.pid_alive(ours):
            time.sleep(0.05)
        assert not cs.pid_alive(ours)
    finally:
        for pid in (ours, theirs, ours_vllm, other):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, 9)


def test_a_strangers_command_is_named_without_its_secrets() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)", "--api-key", "s3cr3t-value"])
    try:
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and "s3cr3t" not in Path(f"/proc/{proc.pid}/cmdline").read_text():
            time.sleep(0.02)
        shown = cs.command_of(proc.pid)
        assert "--api-key" in shown and "s3cr3t-value" not in shown and sys.executable in shown
    finally:
        proc.kill()
        proc.wait()
