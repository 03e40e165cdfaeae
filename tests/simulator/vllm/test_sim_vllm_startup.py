"""The simulator's vLLM mode starting and serving: lines in vLLM 0.26.0's order and shape, the process
tree and its titles, a port bound at once but listening only when ready, and the HTTP front."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import psutil
import pytest
import waiting
from freeport import free_port
from prometheus_client.parser import text_string_to_metric_families

if TYPE_CHECKING:
    from conftest import Sim, SimStarter

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[3]

READY = "Application startup complete."
RECORD = re.compile(r"^\((?P<name>[A-Za-z_0-9]+) pid=(?P<pid>\d+)\) (?P<level>[A-Z]+) \d\d-\d\d \d\d:\d\d:\d\d \[")
MILESTONES = (
    "Initializing a V1 LLM engine (v0.26.0) with config: ",
    "Loading model from scratch...",
    "Loading weights took ",
    "Model loading took ",
    "torch.compile took ",
    "Available KV cache memory: ",
    "GPU KV cache size: ",
    "Maximum concurrency for 131,072 tokens per request: ",
    "Graph capturing finished in ",
    "init engine (profile, create kv cache, warmup model) took ",
    "Starting vLLM server on http://127.0.0.1:",
)


def comm(proc: psutil.Process) -> str:
    with open(f"/proc/{proc.pid}/comm", encoding="utf-8") as f:
        return f.read().strip()


def ready(s: Sim) -> bool:
    return s.wait_out(READY, timeout=30)


def test_start_up_lines_titles_and_a_port_that_listens_only_when_ready(vsim: SimStarter) -> None:
    s = vsim("ok", tp=2)
    saw_loading_without_port = False
    deadline = time.monotonic() + 30
    while READY not in s.stderr() and time.monotonic() < deadline:
        loaded = "Model loading took" in s.stdout()
        listening = s.accepts()
        assert not listening or READY in s.stderr()  # connection refused until uvicorn serves
        saw_loading_without_port |= loaded and not listening
        time.sleep(0.02)
    assert ready(s) and saw_loading_without_port
    out = s.stdout()
    positions = [out.index(m) for m in MILESTONES]
    assert positions == sorted(positions), [m for m in MILESTONES]
    # the records' prefixes: the API server, the engine core, then each worker once renamed
    names = {m["name"] for m in map(RECORD.match, out.splitlines()) if m}
    assert {"APIServer", "EngineCore", "Worker", "Worker_TP0", "Worker_TP1"} <= names
    assert f"(APIServer pid={s.proc.pid}) INFO " in out
    assert "[api_utils.py:345]  ▄▄ ▄█ █     █     █ ▀▄▀ █  version 0.26.0\r\n" in out  # the logo, \r\n-joined
    # the tree: main untitled, VLLM::EngineCore under it, VLLM::Worker_TPn under that; comm cut at 15
    main = psutil.Process(s.proc.pid)
    assert not main.cmdline()[0].startswith("VLLM::")
    engine = [p for p in main.children() if p.cmdline()[:1] == ["VLLM::EngineCore"]]
    assert len(engine) == 1 and comm(engine[0]) == "VLLM::EngineCor"
    # psutil's name() restores a 15-character comm from the command line; ps and /proc/PID/comm do not
    assert engine[0].name() == "VLLM::EngineCore"
    workers = [p for p in engine[0].children() if p.cmdline()[0].startswith("VLLM::")]
    assert sorted(p.cmdline()[0] for p in workers) == ["VLLM::Worker_TP0", "VLLM::Worker_TP1"]
    assert {comm(p) for p in workers} == {"VLLM::Worker_TP"}
    # tqdm on stderr, rank 0 only, decorated; uvicorn's lines decorated too
    err = s.stderr()
    assert "(Worker_TP0 pid=" in err and "Loading safetensors checkpoint shards: 100% Completed | 4/4" in err
    assert "Capturing CUDA graphs (PIECEWISE):" in err and "Capturing CUDA graphs (FULL):" in err
    assert "(Worker_TP1 pid=" not in err
    assert f"(APIServer pid={s.proc.pid}) INFO:     Started server process [{s.proc.pid}]" in err


def test_health_canary_models_version_and_errors(vsim: SimStarter) -> None:
    s = vsim("ok", tp=1)
    assert ready(s)
    status, body = s.request("/health")
    assert (status, body) == (200, b"")
    status, body = s.request("/v1/completions", {"prompt": [1, 2, 3], "max_tokens": 1})
    reply = json.loads(body)
    assert status == 200 and reply["object"] == "text_completion"
    assert reply["usage"] == {
        "prompt_tokens": 3,
        "total_tokens": 4,
        "completion_tokens": 1,
        "prompt_tokens_details": None,
    }
    status, body = s.request(
        "/v1/completions", {"model": "/models/sim", "prompt": "Hello, my name is", "max_tokens": 5}
    )
    assert status == 200 and json.loads(body)["usage"]["completion_tokens"] == 5
    status, body = s.request("/v1/completions", {"model": "other", "prompt": "x"})
    assert status == 404 and json.loads(body)["error"]["message"] == "The model `other` does not exist."
    status, body = s.request("/v1/models")
    card = json.loads(body)["data"][0]
    assert (card["id"], card["owned_by"], card["max_model_len"]) == ("/models/sim", "vllm", 131072)
    assert s.request("/version") == (200, b'{"version": "0.26.0"}')
    assert s.request("/generate")[0] == 404  # SGLang's route is not vLLM's
    assert "INFO:     127.0.0.1:" in s.stdout() and '"POST /v1/completions HTTP/1.1" 200 OK' in s.stdout()
    # world size 1: the uniproc executor, so the worker's lines carry the engine core's prefix
    assert re.search(r"\(EngineCore pid=\d+\) INFO .*\[model_runner.py:305\] Model loading took", s.stdout())
    assert not any(p.cmdline()[0].startswith("VLLM::Worker") for p in s.marked() if p.cmdline())


def families(s: Sim) -> dict[str, object]:
    status, body = s.request("/metrics")
    assert status == 200
    return {f.name: f for f in text_string_to_metric_families(body.decode())}


def test_metrics_names_types_and_labels(vsim: SimStarter) -> None:
    spec = '{"method": "eagle3", "model": "/models/draft", "num_speculative_tokens": 3}'
    s = vsim("ok", "--speculative-config", spec, tp=1)
    assert ready(s)
    for _ in range(3):
        assert s.request("/v1/completions", {"prompt": "hi", "max_tokens": 20})[0] == 200
    got = families(s)
    kinds = {
        "vllm:num_requests_running": "gauge",
        "vllm:num_requests_waiting": "gauge",
        "vllm:generation_tokens": "counter",
        "vllm:prompt_tokens": "counter",
        "vllm:iteration_tokens_total": "histogram",
        "vllm:request_success": "counter",
        "vllm:spec_decode_num_drafts": "counter",
        "vllm:spec_decode_num_draft_tokens": "counter",
        "vllm:spec_decode_num_accepted_tokens": "counter",
    }
    for name, kind in kinds.items():
        family = got[name]
        assert family.type == kind, name  # type: ignore[attr-defined]
        labels = family.samples[0].labels  # type: ignore[attr-defined]
        assert labels["model_name"] == "/models/sim" and labels["engine"] == "0", name
    values = {(x.name, x.labels.get("finished_reason")): x.value for x in got["vllm:request_success"].samples}  # type: ignore[attr-defined]
    assert values[("vllm:request_success_total", "length")] == 3
    generated = got["vllm:generation_tokens"].samples[0].value  # type: ignore[attr-defined]
    assert generated == 60
    count = [x for x in got["vllm:iteration_tokens_total"].samples if x.name.endswith("_count")]  # type: ignore[attr-defined]
    assert count[0].value >= 3  # one observation per engine step


def test_disable_log_stats_drops_every_vllm_family_and_the_stats_lines(vsim: SimStarter) -> None:
    s = vsim("ok", "--disable-log-stats", tp=1, env={"VLLM_LOG_STATS_INTERVAL": "0.5"})
    assert ready(s)
    assert s.request("/v1/completions", {"prompt": "hi", "max_tokens": 30})[0] == 200
    time.sleep(1.5)
    got = families(s)
    assert not [name for name in got if name.startswith("vllm:")]
    assert "http_requests" in got and "process_cpu_seconds" in got
    assert "Avg prompt throughput" not in s.stdout()


def test_stats_lines_while_busy_then_silence_when_idle(vsim: SimStarter) -> None:
    spec = '{"method": "eagle3", "model": "/models/draft", "num_speculative_tokens": 3}'
    s = vsim("ok", "--speculative-config", spec, tp=1, env={"VLLM_LOG_STATS_INTERVAL": "0.5"})
    assert ready(s)
    assert s.request("/v1/completions", {"prompt": "hi", "max_tokens": 200})[0] == 200
    assert s.wait_out("Engine 000: Avg prompt throughput: ")
    assert s.wait_out("SpecDecoding metrics: Mean acceptance length: ")
    time.sleep(2.0)  # idle: one more line with zero throughput, then DEBUG (not shown) while nothing moves
    quiet = s.stdout().count("Engine 000:")
    time.sleep(1.5)
    assert s.stdout().count("Engine 000:") == quiet


def test_sigterm_after_ready_stops_the_tree_and_exits_0(vsim: SimStarter) -> None:
    s = vsim("ok", tp=2)
    assert ready(s)
    tree = s.marked()
    os.kill(s.proc.pid, signal.SIGTERM)
    assert s.proc.wait(15) == 0
    out = s.stdout()
    assert out.index("[shutdown] API server: shutdown triggered") < out.index("[shutdown] MPClient: complete")
    assert "INFO:     Shutting down" in s.stderr()
    assert s.wait_until(lambda: not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in tree), 10)
    assert not s.accepts()


def test_engine_flag_picks_the_engine(tmp_path: Path) -> None:
    """Only a leading `--engine` is the simulator's: `sglang` (or none) keeps SGLang, anything else is refused."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "SGLANG_SIM_PACE": "0.2"}
    base = [sys.executable, "-m", "supervisor.simulator"]
    bad = subprocess.run([*base, "--engine", "trtllm"], env=env, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--engine 'trtllm' is unknown; use sglang or vllm" in bad.stderr
    port = free_port()
    argv = [*base, "--engine", "sglang", "--model-path", "/models/sim", "--host", "127.0.0.1", "--port", str(port)]
    with open(tmp_path / "err", "wb") as err:
        proc = subprocess.Popen(argv, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=err, start_new_session=True)
    try:
        assert waiting.wait_for(lambda: b"server_args=ServerArgs(" in (tmp_path / "err").read_bytes(), 30, 0.05)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
