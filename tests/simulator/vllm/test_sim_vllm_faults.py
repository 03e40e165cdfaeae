"""Every scenario in vLLM mode, as vLLM 0.26.0 behaves under that fault: what the log says, what the port,
/health and the exit do. (The scenario-by-scenario table is in docs/VLLM.md, "The simulator's vLLM".)"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from pathlib import Path
from typing import TYPE_CHECKING

import psutil
import pytest
from simrequests import in_background, sample

from probes.starvation import StarvationProbe

if TYPE_CHECKING:
    from conftest import Sim, SimStarter

pytestmark = pytest.mark.integration

READY = "Application startup complete."
LOADED = "Model loading took"
SPEC = '{"method": "eagle3", "model": "/models/draft", "num_speculative_tokens": 3}'
FAST = {"SGLANG_SIM_FAULT_AFTER_S": "0.3"}


def cpu_s(s: Sim) -> float:
    total = 0.0
    for proc in s.marked():
        with contextlib.suppress(psutil.Error):
            times = proc.cpu_times()
            total += times.user + times.system
    return total


@pytest.mark.parametrize(
    "scenario",
    [
        "deadlock_after_load",
        "busy_hang_after_load",
        "lock_gil_after_load",
        "gpu_sleep_after_load",
        "io_wait_after_load",
    ],
)
def test_after_load_hangs_print_nothing_more_and_never_listen(vsim: SimStarter, scenario: str) -> None:
    s = vsim(scenario, tp=1)
    assert s.wait_out(LOADED)
    before = s.output()
    time.sleep(2.0)
    assert s.output() == before, "a hung engine core printed something"
    assert s.stdout().rstrip().endswith("seconds") and "Available KV cache memory" not in before
    assert not s.accepts() and s.proc.poll() is None
    onset = s.onset()
    assert onset["scenario"] == scenario and onset["pid"] == s.proc.pid


def test_deadlock_after_load_at_tp2_hangs_every_worker_idle(vsim: SimStarter) -> None:
    s = vsim("deadlock_after_load", tp=2)
    assert s.wait_out(LOADED, count=2)
    time.sleep(0.5)
    before, cpu0 = s.output(), cpu_s(s)
    time.sleep(1.5)
    assert s.output() == before and cpu_s(s) - cpu0 < 0.5  # idle: heartbeats only
    workers = [p for p in s.marked() if p.cmdline()[:1] and p.cmdline()[0].startswith("VLLM::Worker_TP")]
    assert len(workers) == 2 and not s.accepts()


def test_unless_flag_turns_the_fault_off_with_vllm_flags(vsim: SimStarter) -> None:
    s = vsim(
        "deadlock_after_load",
        "--enforce_eager",
        "--mystery-flag",
        "7",
        tp=1,
        env={"SGLANG_SIM_UNLESS": "enforce-eager"},
    )
    assert s.wait_out(READY)
    out = s.stdout()
    assert "Enforce eager set, disabling torch.compile and CUDAGraphs." in out and "torch.compile took" not in out
    assert (
        "Capturing CUDA graphs" not in s.stderr() and "init engine (profile, create kv cache, warmup model) took" in out
    )
    assert "'mystery_flag': '7'" in out  # an unknown flag is recorded, shown, and otherwise ignored
    onset = s.onset()
    assert onset["scenario"] == "ok" and onset["requested_scenario"] == "deadlock_after_load"


def test_crash_on_load_in_a_worker_ends_the_server_1(vsim: SimStarter) -> None:
    s = vsim("crash_on_load", tp=2)
    assert s.proc.wait(30) == 1
    out, err = s.stdout(), s.stderr()
    assert "[multiproc_executor.py:901] WorkerProc failed to start." in out
    assert "torch.OutOfMemoryError: CUDA out of memory." in out
    assert "[core.py:1330] EngineCore failed to start." in out
    assert "Exception: WorkerProc initialization failed due to an exception in a background process." in out
    assert "Process EngineCore:" in err
    assert err.rstrip().endswith("Failed core proc(s): {'EngineCore': 1}")
    assert "Loading weights took" not in out.split("WorkerProc failed")[0].split("(Worker_TP0")[-1]
    assert s.onset()["scenario"] == "crash_on_load"


def test_crash_on_load_at_tp1_is_the_engine_core_itself(vsim: SimStarter) -> None:
    s = vsim("crash_on_load", tp=1)
    assert s.proc.wait(30) == 1
    assert "(EngineCore pid=" in s.stdout() and "] EngineCore failed to start." in s.stdout()
    assert "torch.OutOfMemoryError" in s.stderr() and "Engine core initialization failed." in s.stderr()


def test_crash_after_ready_fails_the_next_forward_and_the_server_exits_0(vsim: SimStarter) -> None:
    s = vsim("crash_after_ready", tp=2, env=FAST)
    assert s.wait_out(READY)
    time.sleep(0.5)
    status, body = s.request("/v1/completions", {"prompt": "hi", "max_tokens": 2})
    assert status == 500 and json.loads(body)["error"]["type"] == "InternalServerError"
    assert s.proc.wait(15) == 0
    out = s.stdout()
    assert "WorkerProc hit an exception." in out and "CUDA error: an illegal memory access was encountered" in out
    assert out.index("EngineCore encountered a fatal error.") < out.index("AsyncLLM output_handler failed.")
    assert "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue." in out
    assert "INFO:     Finished server process" in s.stderr()


def test_rank_dies_the_executor_shuts_down_and_the_server_follows(vsim: SimStarter) -> None:
    s = vsim("rank_dies", tp=2, env=FAST)
    assert s.wait_out(READY)
    assert s.proc.wait(20) == 0  # the watchdog (every 5 s) ends the server once the engine is dead
    out = s.stdout()
    died = out.index("Worker proc VllmWorker-1 died unexpectedly (exit code: -11), shutting down executor.")
    assert died < out.index("RuntimeError: Executor failed.") < out.index("AsyncLLM output_handler failed.")
    assert "Parent process exited, terminating worker queues" in out  # worker 0 follows its executor
    assert s.onset()["scenario"] == "rank_dies"


def test_rank_dies_at_tp1_is_the_engine_core(vsim: SimStarter) -> None:
    s = vsim("rank_dies", tp=1, env=FAST)
    assert s.wait_out(READY)
    assert s.proc.wait(20) == 0
    out = s.stdout()
    assert "[shutdown] MPClient: engine core exited unexpectedly; starting cleanup" in out
    assert "EngineCore encountered a fatal error" not in out  # a SIGSEGV says nothing


def test_health_hangs_health_stays_200_while_the_canary_never_answers(vsim: SimStarter) -> None:
    s = vsim("health_hangs", tp=1, env=FAST)
    assert s.wait_out(READY)
    time.sleep(0.5)
    canary = in_background(s, {"prompt": [1], "max_tokens": 1}, 8)
    time.sleep(3)
    assert canary == {}  # still waiting
    assert s.request("/health") == (200, b"")  # /health reads a flag (vllm#46811)
    assert sample(s, "vllm:num_requests_running") == 0  # frozen before the hung step published anything
    assert s.proc.poll() is None and s.onset()["scenario"] == "health_hangs"


def test_serving_stall_at_tp2_warns_then_times_out_and_the_server_exits(vsim: SimStarter) -> None:
    env = {**FAST, "VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS": "4", "VLLM_RINGBUFFER_WARNING_INTERVAL": "1"}
    s = vsim("serving_stall", tp=2, env=env)
    assert s.wait_out(READY)
    time.sleep(0.5)
    stuck = in_background(s, {"prompt": "hi", "max_tokens": 50}, 20)
    assert s.wait_out("No available shared memory broadcast block found in 1 seconds.")
    assert s.request("/health") == (200, b"")
    assert sample(s, "vllm:num_requests_running") == 1  # admitted; its decode never ends
    tokens = sample(s, "vllm:generation_tokens_total")
    time.sleep(1)
    assert sample(s, "vllm:generation_tokens_total") == tokens
    assert s.proc.wait(20) == 0
    assert "TimeoutError: RPC call to execute_model timed out." in s.stdout()
    assert s.wait_until(lambda: stuck.get("status") == 500, 5)


def test_low_accept_shows_in_the_spec_decode_counters(vsim: SimStarter) -> None:
    s = vsim("low_accept", "--speculative-config", SPEC, tp=1)
    assert s.wait_out(READY)
    for _ in range(4):
        assert s.request("/v1/completions", {"prompt": "hi", "max_tokens": 200})[0] == 200
    accepted = sample(s, "vllm:spec_decode_num_accepted_tokens_total")
    drafted = sample(s, "vllm:spec_decode_num_draft_tokens_total")
    assert 0.08 < accepted / drafted < 0.25
    assert s.onset()["scenario"] == "low_accept"


def test_healthy_speculation_accepts_most_drafts(vsim: SimStarter) -> None:
    s = vsim("ok", "--speculative-config", SPEC, tp=1)
    assert s.wait_out(READY)
    for _ in range(2):
        assert s.request("/v1/completions", {"prompt": "hi", "max_tokens": 200})[0] == 200
    rate = sample(s, "vllm:spec_decode_num_accepted_tokens_total") / sample(
        s, "vllm:spec_decode_num_draft_tokens_total"
    )
    assert 0.6 < rate < 0.8


def test_ignore_sigterm_every_process_ignores_it(vsim: SimStarter) -> None:
    s = vsim("ignore_sigterm", tp=2)
    assert s.wait_out(READY)
    tree = s.marked()
    os.killpg(s.proc.pid, signal.SIGTERM)
    time.sleep(1.5)
    assert all(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in tree)
    assert s.request("/health")[0] == 200 and "[shutdown]" not in s.stdout()


def test_escape_group_keeps_the_port_after_the_group_dies(vsim: SimStarter) -> None:
    s = vsim("escape_group", tp=1)
    assert s.wait_out(READY)
    main_sid = os.getsid(s.proc.pid)
    assert s.wait_until(lambda: [p for p in s.marked() if os.getsid(p.pid) != main_sid], 5)
    os.killpg(s.proc.pid, signal.SIGKILL)
    s.proc.wait(5)
    assert s.accepts()  # the escapee holds the listening socket


def test_log_flood_is_vllm_request_records_some_not_utf8(vsim: SimStarter) -> None:
    s = vsim("log_flood", tp=1, env={"SGLANG_SIM_FLOOD_MB": "3"})
    assert s.wait_out(READY)
    assert s.wait_until(lambda: s.out_path.stat().st_size > 3 * 1024 * 1024, 20)
    raw = s.out_path.read_bytes()
    assert b"] Received request cmpl-" in raw and b"[request_logger.py:63] Received request" in raw
    with pytest.raises(UnicodeDecodeError):
        raw.decode("utf-8")
    assert raw.count(f"(APIServer pid={s.proc.pid}) INFO".encode()) > 1000  # each line decorated


def test_slow_load_crawls(vsim: SimStarter) -> None:
    s = vsim("slow_load", tp=1, env={"SGLANG_SIM_SHARD_S": "1.2"})
    assert s.wait_out("Loading safetensors checkpoint shards:  25% Completed | 1/4")
    assert s.wait_until(lambda: "s/it]" in s.stderr(), 10)
    assert s.wait_out(READY, timeout=30) and s.onset()["scenario"] == "slow_load"


def test_quiet_load_is_silent_then_starts(vsim: SimStarter) -> None:
    s = vsim("quiet_load", tp=1, env={"SGLANG_SIM_QUIET_S": "3"})
    assert s.wait_out("Auto-prefetch is disabled")
    before = s.output()
    time.sleep(1.0)
    assert s.output() == before  # reading, not printing
    assert s.wait_out(READY, timeout=30)


def test_long_compile_at_tp2_makes_the_engine_core_say_it_waits(vsim: SimStarter) -> None:
    env = {"SGLANG_SIM_COMPILE_S": "3", "VLLM_RINGBUFFER_WARNING_INTERVAL": "1"}
    s = vsim("long_compile", tp=2, env=env)
    assert s.wait_out("Using cache directory: ", count=2)
    assert s.wait_out("No available shared memory broadcast block found in 1 seconds.")
    assert "torch.compile took" not in s.stdout()
    assert s.wait_out("torch.compile took", timeout=20)
    out = s.stdout()
    assert out.index("(EngineCore pid=") < out.index("No available shared memory")
    assert s.onset()["scenario"] == "long_compile"


def test_busy_capture_hang_spins_inside_the_capture(vsim: SimStarter) -> None:
    s = vsim("busy_capture_hang", tp=1)
    assert s.wait_out("Capturing CUDA graphs (FULL):")
    time.sleep(0.5)
    engine = [p.pid for p in s.marked() if p.cmdline()[:1] == ["VLLM::EngineCore"]]
    probe = StarvationProbe()
    first = probe.observe(engine)
    time.sleep(1.5)
    second = probe.observe(engine)
    # on a CPU or waiting for one most of the time, however loaded the machine: one thread spins
    assert (second.on_cpu_s - first.on_cpu_s) + (second.run_wait_s - first.run_wait_s) > 0.9
    assert "Graph capturing finished" not in s.stdout() and not s.accepts()
    assert s.onset()["scenario"] == "busy_capture_hang"


def test_gpu_file_shows_the_never_ending_kernel(vsim: SimStarter, tmp_path: Path) -> None:
    nvml = tmp_path / "nvml.json"
    nvml.write_text(json.dumps({"devices": [{"util": 3, "gpm": {"sm_util": 0.0, "sm_occupancy": 0.0}}]}))
    s = vsim("gpu_sleep_after_load", tp=1, env={"SGLANG_SIM_GPU_FILE": str(nvml)})
    assert s.wait_out(LOADED)
    assert s.wait_until(lambda: json.loads(nvml.read_text())["devices"][0]["util"] == 100.0, 5)
