"""A normal start: SGLang's lines in order, real children, a late port, and the endpoints' answers."""

from __future__ import annotations

import json
import re
import signal
import time
from typing import TYPE_CHECKING

import psutil
import pytest

if TYPE_CHECKING:
    from conftest import SimStarter

pytestmark = pytest.mark.integration

READY = "The server is fired up and ready to roll!"
KEY_LINES = [  # SGLang 0.5.16's wording (tests/fixtures/real_sglang holds the transcripts)
    "] Max running requests is reset to 48 for speculative decoding.",
    "server_args=ServerArgs(model_path='/models/sim', ",
    "TP0] Init torch distributed begin.",
    "TP0] Init torch distributed ends. elapsed=",
    "TP0] Load weight begin. avail mem=",
    "\rMulti-thread loading shards:   0% Completed | 0/8 [00:00<?, ?it/s]",
    "\rMulti-thread loading shards: 100% Completed | 8/8 [",
    "TP0] Load weight end. elapsed=",
    " s, type=LlamaForCausalLMEagle3, avail mem=",
    "TP0] KV Cache is allocated. dtype: torch.bfloat16, #tokens: ",
    "TP0] Memory pool end. avail mem=",
    "TP0] Capture target verify CUDA graph begin. backend=full, num_tokens_per_req=4, bs=[1, 2, 4, 8, 16,",
    "\rCapturing batches (bs=160 avail_mem=",
    "TP0] Capture target verify CUDA graph end. elapsed=",
    "TP0] Capture target prefill CUDA graph begin. backend=breakable, num_tokens=[4, 8, 12,",
    "\rCapturing num tokens (num_tokens=960 avail_mem=",
    "TP0] Capture target prefill CUDA graph end. elapsed=",
    "TP0] Capture draft decode CUDA graph begin. backend=full, num_tokens_per_req=1, bs=[",
    "TP0] Capture draft extend CUDA graph end. elapsed=",
    "TP0] max_total_num_tokens=",
    "] INFO:     Started server process [",
    "] INFO:     Waiting for application startup.",
    "] INFO:     Application startup complete.",
    "] INFO:     Uvicorn running on http://127.0.0.1:",
    "TP0] Prefill batch, #new-seq: 1, #new-token: ",
    READY,
]
SPEC = ("--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", "/models/draft")


def _rank0_find(log: str, line: str) -> int:
    """Where rank 0 (or the main process) printed `line`: a line without a rank prefix that every rank
    prints (the draft's `Load weight end`) is looked for on TP0's line, since TP1 may be a step ahead."""
    if line.startswith(" s, type="):
        m = re.search(r"TP0\] Load weight end\.[^\n]*" + re.escape(line), log)
        return m.start() if m else -1
    return log.find(line)


def test_ok_prints_sglangs_start_up_in_order_and_binds_late(sim: SimStarter) -> None:
    s = sim("ok", *SPEC, "--enable-metrics")
    saw_closed_while_loading = False
    deadline = time.monotonic() + 30
    while READY not in s.stderr() and time.monotonic() < deadline:
        accepted = s.accepts()
        log = s.stderr()  # read after the probe: a bound port means the bind line came first
        if accepted:
            assert "INFO:     Started server process" in log, "port bound before uvicorn started"
        elif "Load weight begin" in log:
            saw_closed_while_loading = True
        if "Uvicorn running on" in log:
            assert s.accepts()
        time.sleep(0.02)
    log = s.stderr()
    assert READY in log, log[-2000:]
    assert saw_closed_while_loading
    positions = [_rank0_find(log, line) for line in KEY_LINES]
    assert all(p >= 0 for p in positions), [line for line, p in zip(KEY_LINES, positions, strict=True) if p < 0]
    assert positions == sorted(positions), ("start-up lines out of order", list(zip(KEY_LINES, positions, strict=True)))
    assert log.count("Multi-thread loading shards: 100% Completed | 8/8") == 2  # tqdm's closing repeat
    assert re.search(r"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d TP1\] Load weight end\.", log)  # every rank logs
    assert "TP1] Capture target verify CUDA graph end." in log
    assert "TP1] Capture draft" not in log  # eagle_worker_v2 logs its captures on rank 0 only
    assert "TP1] \rLoading" not in log and log.count("0/8 [00:00<?, ?it/s]") == 1  # bars: rank 0 only
    # uvicorn's access log goes to stdout, warm-up included
    assert s.wait_until(lambda: '"POST /generate HTTP/1.1" 200 OK' in s.stdout(), 5)
    assert re.search(r'\] INFO:     127\.0\.0\.1:\d+ - "GET /model_info HTTP/1\.1" 200 OK', s.stdout())
    for word in ("simulat", "SGLANG_SIM", "scenario"):
        assert word not in log.lower() and word not in s.stdout().lower()


def test_children_are_sglangs_processes(sim: SimStarter) -> None:
    s = sim("ok", tp=2)
    assert s.wait_log("TP1] Init torch distributed begin.")
    expected = ["sglang::detokenizer", "sglang::scheduler_TP0", "sglang::scheduler_TP1"]

    def titles() -> list[str]:
        # each child names itself as it starts: one may log before a sibling has set its title
        return sorted(c.cmdline()[0] for c in s.children() if c.cmdline() and c.cmdline()[0].startswith("sglang::"))

    assert s.wait_until(lambda: titles() == expected, 5), titles()
    main_sid = psutil.Process(s.proc.pid)
    for child in s.children():
        assert child.pid != s.proc.pid
        assert psutil.Process(child.pid).ppid() == main_sid.pid
    assert s.wait_log(READY)
    tp0 = s.schedulers()[0]
    assert tp0.name().startswith("sglang::")  # comm, as ps shows it
    assert tp0.io_counters().read_chars > 4 * 1024 * 1024  # the weights were really read
    assert tp0.memory_info().rss > 16 * 1024 * 1024  # and are held


def test_endpoints_answer_like_sglang(sim: SimStarter) -> None:
    s = sim("ok", *SPEC, "--enable-metrics", "--decode-log-interval", "5", tp=1)
    assert s.wait_log(READY)
    tic = time.monotonic()
    assert s.request("/health") == (200, b"")
    assert time.monotonic() - tic >= 0.05  # a one-token generate, not a bare 200
    assert s.request("/health_generate")[0] == 200
    status, body = s.request("/get_model_info")
    assert status == 200 and json.loads(body)["model_path"] == "/models/sim"
    assert json.loads(s.request("/v1/models")[1])["data"][0]["id"] == "/models/sim"
    assert s.request("/nope")[0] == 404
    status, body = s.generate(40)
    result = json.loads(body)
    assert status == 200 and result["meta_info"]["completion_tokens"] == 40 and result["text"]
    info = json.loads(s.request("/get_server_info")[1])
    state = info["internal_states"][0]
    assert info["tp_size"] == 1 and "memory_usage" in state and "last_gen_throughput" in state
    assert 2.5 < state["avg_spec_accept_length"] <= 4  # speculative forwards happened
    m = s.metrics()
    for name in ("num_running_reqs", "num_queue_reqs", "gen_throughput", "token_usage", "cache_hit_rate",
                 "spec_accept_length", "spec_accept_rate", "is_cuda_graph", "prompt_tokens_total",
                 "generation_tokens_total", "num_requests_total", "realtime_tokens_total",
                 "time_to_first_token_seconds_count"):
        assert f"sglang:{name}" in m, name
    assert m["sglang:generation_tokens_total"] >= 40 and m["sglang:num_requests_total"] >= 2  # warm-up too
    assert m["sglang:spec_accept_length"] > 2.5 and m["sglang:is_cuda_graph"] == 1.0
    assert " TP0]" not in s.stderr()  # tp-size 1: SGLang prints no rank tag
    decode = [line for line in s.stderr().splitlines() if "Decode batch" in line]
    assert decode and re.search(
        r"\d\d\] Decode batch, #running-req: 1, #token: \d+, token usage: 0\.00, accept len: \d\.\d\d, "
        r"accept rate: [01]\.\d\d, cuda graph: True, gen throughput \(token/s\): \d+\.\d\d, #queue-req: 0$",
        decode[-1],
    ), decode[-1]


def test_no_metrics_route_without_the_flag(sim: SimStarter) -> None:
    s = sim("ok", "--skip-server-warmup", tp=1)
    assert s.wait_log(READY)
    assert s.request("/metrics")[0] == 404
    assert "POST /generate" not in s.stdout()  # warm-up skipped


def test_sigterm_when_serving_exits_zero_quickly(sim: SimStarter) -> None:
    s = sim("ok", tp=2)
    assert s.wait_log(READY)
    kids = s.children()
    tic = time.monotonic()
    s.proc.send_signal(signal.SIGTERM)
    assert s.proc.wait(5) == 0
    assert time.monotonic() - tic < 2.5
    assert "SIGTERM received" in s.stderr()
    assert s.wait_until(lambda: not any(k.is_running() and k.status() != psutil.STATUS_ZOMBIE for k in kids), 3)


def test_sigterm_during_load_kills_like_sglang(sim: SimStarter) -> None:
    """No handler is installed before serving: the default action, children follow by PDEATHSIG."""
    s = sim("slow_load", tp=2, env={"SGLANG_SIM_SHARD_S": "5"})
    assert s.wait_log("Load weight begin", count=2)
    kids = s.children()
    s.proc.send_signal(signal.SIGTERM)
    assert s.proc.wait(5) == -signal.SIGTERM
    assert s.wait_until(lambda: not any(k.is_running() and k.status() != psutil.STATUS_ZOMBIE for k in kids), 3)
