"""The probes read vLLM 0.26.0 through its profile: its lines, metrics, titles and its flag-only
/health with a canary generation (issue 37). Lines are vLLM's own formats (vllm/logger.py `_FORMAT`,
`decorate_logs`), with the messages of the source lines named in supervisor/engines/vllm.py."""

from __future__ import annotations

import json

import httpx
import pytest

from probes.http import Canary, HealthProbe
from probes.logs import LogParser, split_prefix
from probes.proctree import _alone_rank, role_of
from probes.serving import parse_metrics
from probes.types import LogLine, ProcInfo, SpecCounts
from supervisor.engines import SGLANG, VLLM

EC = "(EngineCore_DP0 pid=4242) "
W1 = "(Worker_TP1 pid=4250) "


def rec(msg: str, where: str = "core.py:93", proc: str = "") -> str:
    return f"{proc}INFO 12-06 00:10:11 [{where}] {msg}"


def feed(parser: LogParser, *texts: str) -> None:
    parser.feed(LogLine(seq=i, at=float(i), stream="stdout", text=t) for i, t in enumerate(texts, 1))


def test_split_prefix_reads_vllms_record_and_the_childs_rank() -> None:
    assert split_prefix(rec("hello", proc=W1), "level") == ("TP1", "hello")
    assert split_prefix(rec("hello", proc=EC), "level") == ("DP0", "hello")
    assert split_prefix(rec("hello"), "level") == ("", "hello")
    assert split_prefix("plain text", "level") == ("", "plain text")


def test_vllm_start_up_lines_move_the_phase_forward() -> None:
    p = LogParser(VLLM.log)
    feed(p, rec("Initializing a V1 LLM engine (v0.26.0) with config: model='/m'", proc=EC))
    assert p.observe().phase == "initializing"
    feed(p, rec("Starting to load model /m...", "gpu_model_runner.py:5251", proc=EC))
    feed(p, "Loading safetensors checkpoint shards:  50% Completed | 1/2 [00:01<00:01,  1.10it/s]")
    o = p.observe()
    assert o.phase == "loading_weights" and o.progress is not None and o.progress.unit == "shards"
    feed(p, rec("Loading weights took 1.20 seconds", "default_loader.py:431", proc=EC))
    feed(p, rec("Loading drafter model...", "gpu_model_runner.py:5274", proc=EC))
    assert p.observe().phase == "loading_draft"
    feed(p, rec("Dynamo bytecode transform time: 3.10 s", "backends.py:1156", proc=EC))
    feed(p, rec("Available KV cache memory: 40.1 GiB", "gpu_worker.py:561", proc=EC))
    assert p.observe().phase == "allocating_kv"  # vLLM loads its drafter before the KV cache
    feed(p, "Capturing CUDA graphs (mixed prefill-decode, PIECEWISE):  40%|####      | 4/10 [00:01<00:01]")
    assert p.observe().phase == "capturing_graphs"
    feed(p, rec("Starting vLLM server on http://127.0.0.1:8000", "api_server.py:677"))
    feed(p, "INFO:     Application startup complete.")
    o = p.observe()
    assert o.phase == "warming_up" and not o.ready_line_seen  # vLLM prints no ready line: port and canary


def test_model_runner_v2s_load_line_starts_the_weights_too() -> None:
    p = LogParser(VLLM.log)
    feed(p, rec("Loading model from scratch...", "model_runner.py:284", proc=EC))
    assert p.observe().phase == "loading_weights"


def test_waiting_lines_are_output_but_not_progress() -> None:
    """shm_broadcast.py:96, repeated while a rank waits on a peer that never answers."""
    p = LogParser(VLLM.log)
    feed(p, rec("Starting to load model /m...", proc=EC))
    before = p.observe()
    wait = "No available shared memory broadcast block found in 60 seconds. This typically happens when ..."
    p.feed([LogLine(seq=9, at=99.0, stream="stdout", text=rec(wait, "shm_broadcast.py:705", proc=EC))])
    after = p.observe()
    assert after.lines_total == before.lines_total + 1 and after.progress_lines == before.progress_lines
    assert after.last_line_at == before.last_line_at and any("broadcast block" in e for e in after.errors)
    sg = LogParser()  # SGLang's grammar has no waiting line: every line is progress there
    feed(sg, wait)
    assert sg.observe().progress_lines == 1


def test_vllm_stats_and_spec_lines_feed_the_decode_view() -> None:
    p = LogParser(VLLM.log)
    feed(
        p,
        rec("Engine 000: Avg prompt throughput: 10.0 tokens/s, Avg generation throughput: 123.4 tokens/s, "
            "Running: 3 reqs, Waiting: 1 reqs, GPU KV cache usage: 0.5%, Prefix cache hit rate: 0.0%",
            "loggers.py:311", proc=EC),
        rec("SpecDecoding metrics: Mean acceptance length: 1.15, Accepted throughput: 1.00 tokens/s, "
            "Drafted throughput: 9.00 tokens/s, Accepted: 3 tokens, Drafted: 20 tokens, "
            "Per-position acceptance rate: 0.150, 0.000, Avg Draft acceptance rate: 15.0%", "metrics.py:121", proc=EC),
    )  # fmt: skip
    o = p.observe()
    d = o.last_decode
    assert o.decode_lines_total == 1 and d is not None
    assert (d.running_reqs, d.queue_reqs, d.gen_throughput, d.accept_len) == (3, 1, 123.4, 1.15)


def test_vllm_errors_are_kept_and_sglang_lines_mean_nothing_to_the_vllm_grammar() -> None:
    p = LogParser(VLLM.log)
    feed(
        p,
        rec("Worker proc VllmWorker-1 died unexpectedly (exit code: -9), shutting down executor.",
            "multiproc_executor.py:285", proc=EC),
        "[2026-12-06 00:00:00 TP0] Load weight begin. avail mem=70.00 GB",
    )  # fmt: skip
    o = p.observe()
    assert o.phase == "spawning" and any("died unexpectedly" in e for e in o.errors)


def test_the_sglang_grammar_is_unchanged_by_default() -> None:
    p = LogParser()
    feed(p, "[2026-12-06 00:00:00 TP0] Load weight begin. avail mem=70.00 GB")
    assert p.observe().phase == "loading_weights" and LogParser(SGLANG.log).observe().phase == "spawning"


VLLM_METRICS = """\
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 2.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 1.0
# TYPE vllm:generation_tokens counter
vllm:generation_tokens_total{engine="0",model_name="m"} 500.0
# TYPE vllm:iteration_tokens_total histogram
vllm:iteration_tokens_total_bucket{engine="0",le="+Inf",model_name="m"} 40.0
vllm:iteration_tokens_total_count{engine="0",model_name="m"} 40.0
vllm:iteration_tokens_total_sum{engine="0",model_name="m"} 620.0
# TYPE vllm:request_success counter
vllm:request_success_total{engine="0",finished_reason="length",model_name="m"} 7.0
vllm:request_success_total{engine="0",finished_reason="stop",model_name="m"} 3.0
# TYPE vllm:spec_decode_num_drafts counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} DRAFTS
# TYPE vllm:spec_decode_num_accepted_tokens counter
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} ACCEPTED
"""


def vllm_metrics(drafts: float, accepted: float) -> str:
    return VLLM_METRICS.replace("DRAFTS", str(drafts)).replace("ACCEPTED", str(accepted))


def test_vllm_metrics_give_the_serving_view() -> None:
    o = parse_metrics(vllm_metrics(100, 15), 1.0, VLLM.metrics)
    assert o.available and (o.running_reqs, o.queue_reqs) == (2.0, 1.0)
    assert (o.generation_tokens_total, o.decode_tokens_total, o.num_requests_total) == (500.0, 620.0, 10.0)
    assert o.spec_counts == SpecCounts(100.0, 15.0) and o.spec_accept_length == pytest.approx(1.15)
    assert o.active_requests is None and o.gen_throughput is None


def test_vllm_acceptance_is_the_interval_since_the_last_scrape() -> None:
    first = parse_metrics(vllm_metrics(100, 90), 1.0, VLLM.metrics)
    later = parse_metrics(vllm_metrics(200, 100), 2.0, VLLM.metrics, first.spec_counts)
    assert first.spec_accept_length == pytest.approx(1.9) and later.spec_accept_length == pytest.approx(1.1)
    idle = parse_metrics(vllm_metrics(200, 100), 3.0, VLLM.metrics, later.spec_counts)
    assert idle.spec_accept_length is None  # no draft since: no reading, not a regression
    restarted = parse_metrics(vllm_metrics(10, 1), 4.0, VLLM.metrics, later.spec_counts)
    assert restarted.spec_accept_length is None


def test_sglang_names_read_nothing_of_vllms_body() -> None:
    o = parse_metrics(vllm_metrics(100, 15), 1.0)
    assert o.available and o.running_reqs is None and o.spec_accept_length is None


def test_vllm_titles() -> None:
    t = VLLM.titles
    assert role_of("VLLM::Worker_TP3", False, None, t) == ("scheduler", 3)
    assert role_of("VLLM::Worker_PP0_TP1", False, None, t) == ("scheduler", 1)
    assert role_of("VLLM::EngineCore_DP0", False, None, t) == ("controller", None)
    assert role_of("VLLM::Worker_TP3", False) == ("other", None)  # SGLang's names do not know it


def proc(pid: int, title: str, role: str, rank: int | None = None) -> ProcInfo:
    return ProcInfo(
        pid=pid, ppid=1, title=title, status="sleeping", role=role, rank=rank, cpu_time_s=0.0, rss_bytes=0,  # type: ignore[arg-type]
        read_chars=0, write_chars=0, num_threads=1, threads=(), sid=1, pgid=1,
    )  # fmt: skip


def test_the_engine_core_is_rank_0_only_when_no_worker_exists() -> None:
    main, core = proc(1, "python3 -m vllm...", "main"), proc(2, "VLLM::EngineCore_DP0", "controller")
    alone = _alone_rank([main, core], VLLM.titles)
    assert [(p.role, p.rank) for p in alone] == [("main", None), ("scheduler", 0)]
    worker = proc(3, "VLLM::Worker_TP0", "scheduler", 0)
    assert _alone_rank([main, core, worker], VLLM.titles) == [main, core, worker]
    assert _alone_rank([main, core], SGLANG.titles) == [main, core]


def canary_server(flag: int, answer: httpx.Response | None) -> httpx.AsyncClient:
    seen: list[str] = []

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(f"{request.method} {request.url.path}")
        if request.url.path == "/health":
            return httpx.Response(flag)
        assert json.loads(request.content) == {"prompt": [1], "max_tokens": 1, "temperature": 0}
        if answer is None:
            raise httpx.ReadTimeout("timed out")
        return answer

    client = httpx.AsyncClient(transport=httpx.MockTransport(handle))
    client.seen = seen  # type: ignore[attr-defined]
    return client


CANARY = Canary(VLLM.canary_path, VLLM.canary_body)


@pytest.mark.parametrize(
    ("flag", "answer", "canary", "ok", "error"),
    [
        (200, httpx.Response(200, json={"choices": [{"text": "x"}]}), True, True, ""),
        (200, None, True, False, "canary generation: "),  # vllm#46811: /health 200 over a hung engine
        (200, httpx.Response(200, json={"choices": []}), True, False, "without a choice"),
        (200, httpx.Response(500), True, False, "canary generation: HTTP 500"),
        (503, None, True, False, "HTTP 503"),  # EngineDeadError: no canary needed
        (200, None, False, True, ""),  # serving with requests in flight: the flag alone
    ],
)
async def test_canary(flag: int, answer: httpx.Response | None, canary: bool, ok: bool, error: str) -> None:
    client = canary_server(flag, answer)
    probe = HealthProbe("http://127.0.0.1:8000", "/health", 5.0, client=client, canary=CANARY)
    got = await probe.probe(canary=canary)
    assert got.ok is ok and error in got.error
    wanted = ["GET /health"] + (["POST /v1/completions"] if canary and flag == 200 else [])
    assert client.seen == wanted  # type: ignore[attr-defined]
    await client.aclose()
