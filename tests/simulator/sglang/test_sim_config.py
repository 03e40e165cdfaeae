"""Command line, environment, derived figures and the metrics text: no processes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from supervisor.simulator.argv import parse_args, split_unknown
from supervisor.simulator.messages import SchedulerStats
from supervisor.simulator.modelcard import capture_batch_sizes, model_facts
from supervisor.simulator.options import Scenario, SettingsError, effective_scenario, flag_given, load_settings
from supervisor.simulator.sglang.exposition import render
from supervisor.simulator.sglang.serverargs import server_args_line
from supervisor.simulator.sglang.tokenizer import Histogram, MetricsSnapshot


def test_known_and_unknown_flags() -> None:
    argv = ["--model-path", "/m", "--tp", "8", "--enable-metrics", "--foo", "1", "--bar", "--baz=x"]
    args = parse_args([*argv, "--disable-cuda"])
    assert (args.model_path, args.tp_size, args.enable_metrics) == ("/m", 8, True)
    assert (args.port, args.host) == (30000, "127.0.0.1")
    assert args.decode_log_interval == 40 and args.cuda_graph
    assert args.unknown_flags == ("--foo", "1", "--bar", "--baz=x", "--disable-cuda")  # no abbreviation matching
    assert args.extra == (("foo", "1"), ("bar", True), ("baz", "x"), ("disable-cuda", True))


def test_split_unknown_edge_cases() -> None:
    assert split_unknown(["stray", "--", "--a", "--b", "v"]) == (("a", True), ("b", "v"))


def test_cuda_graph_off_either_way() -> None:
    assert not parse_args(["--model-path", "m", "--disable-cuda-graph"]).cuda_graph
    assert not parse_args(["--model-path", "m", "--cuda-graph-backend-decode", "disabled"]).cuda_graph


def test_missing_model_path_is_argparses_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        parse_args(["--tp-size", "2"])
    assert exc.value.code == 2
    assert "--model-path" in capsys.readouterr().err


def test_unless_replaces_the_scenario_when_any_named_flag_is_given() -> None:
    argv = ["--model-path", "m", "--cuda-graph-max-bs=8"]
    assert flag_given(argv, "cuda-graph-max-bs") and flag_given(argv, "--cuda-graph-max-bs")
    assert not flag_given(argv, "cuda-graph")
    dl = Scenario.DEADLOCK_AFTER_LOAD
    assert effective_scenario(dl, "disable-cuda-graph, cuda-graph-max-bs", argv) is Scenario.OK
    assert effective_scenario(dl, "disable-cuda-graph", argv) is dl
    assert effective_scenario(dl, "", argv) is dl


def test_settings_defaults_and_errors() -> None:
    s = load_settings({}, [])
    assert s.scenario is Scenario.OK and s.pace == 1.0 and s.health_check_timeout_s == 20.0
    assert s.shard_seconds == 0.5 and s.quiet_seconds == 60.0 and s.mem_mb == 16.0
    slow = load_settings({"SGLANG_SIM_SCENARIO": "slow_load", "SGLANG_SIM_PACE": "0.2"}, [])
    assert slow.shard_seconds == 33.0 and slow.quiet_seconds == pytest.approx(12.0)
    assert load_settings({"SGLANG_SIM_SHARD_S": "2"}, []).shard_seconds == 2.0
    with pytest.raises(SettingsError, match="SGLANG_SIM_SCENARIO"):
        load_settings({"SGLANG_SIM_SCENARIO": "nope"}, [])
    with pytest.raises(SettingsError, match="SGLANG_SIM_PACE"):
        load_settings({"SGLANG_SIM_PACE": "fast"}, [])


def test_facts_from_a_model_directory(tmp_path: Path) -> None:
    config = {"architectures": ["Qwen3ForCausalLM"], "max_position_embeddings": 4096}
    (tmp_path / "config.json").write_text(json.dumps(config))
    for i in range(3):
        (tmp_path / f"model-{i:05d}.safetensors").write_bytes(b"\0" * 10)
    facts = model_facts(parse_args(["--model-path", str(tmp_path), "--tp-size", "4"]))
    assert (facts.architecture, facts.context_len, facts.num_shards) == ("Qwen3ForCausalLM", 4096, 3)
    assert facts.kv_tokens > 0 and facts.avail_after_graphs > 0


def test_facts_without_a_directory() -> None:
    facts = model_facts(parse_args(["--model-path", "/nowhere", "--speculative-algorithm", "EAGLE3"]))
    assert facts.architecture == "DeepseekV3ForCausalLM" and facts.num_shards == 8
    assert facts.draft_architecture == "LlamaForCausalLMEagle3"
    assert len(facts.capture_bs) == 23 and facts.capture_bs[0] == 160  # walked largest first
    assert capture_batch_sizes(8) == [8, 4, 2, 1]


def test_server_args_line() -> None:
    args = parse_args(["--model-path", "/m", "--tp-size", "2", "--port", "31000", "--some-new-flag", "v"])
    line = server_args_line(args, model_facts(args))
    assert line.startswith("server_args=ServerArgs(model_path='/m', tokenizer_path='/m', ")
    assert "tp_size=2," in line and "port=31000," in line and line.endswith("some_new_flag='v')")


def test_metrics_text_uses_sglangs_names() -> None:
    h = Histogram((0.1, 1.0))
    h.observe(0.5)
    snap = MetricsSnapshot(
        stats=SchedulerStats(num_running_reqs=3, spec_accept_length=1.15, max_total_num_tokens=10),
        prompt_tokens_total=7,
        generation_tokens_total=9,
        num_requests_total=1,
        num_aborted_requests_total=0,
        realtime_decode_tokens_total=8,
        realtime_prefill_tokens_total=7,
        ttft=h.cumulative(),
        ttft_sum=h.total,
        e2e=h.cumulative(),
        e2e_sum=h.total,
    )
    text = render(lambda: snap, "m").decode()
    labels = 'engine_type="unified",model_name="m",moe_ep_rank="0",pp_rank="0",tp_rank="0"'  # SGLang 0.5.16
    assert f"sglang:num_running_reqs{{{labels}}} 3.0" in text
    assert f"sglang:spec_accept_length{{{labels}}} 1.15" in text
    gauges = ("num_queue_reqs", "gen_throughput", "token_usage", "cache_hit_rate", "spec_accept_rate", "is_cuda_graph",
              "spec_cap_length", "spec_block_accept_length", "spec_num_steps", "spec_num_draft_tokens")
    for name in gauges:
        assert f"sglang:{name}{{" in text
    tok = 'engine_type="unified",model_name="m"'
    assert f"sglang:generation_tokens_total{{{tok}}} 9.0" in text
    assert f"sglang:prompt_tokens_total{{{tok}}} 7.0" in text
    assert f"sglang:num_requests_total{{{tok}}} 1.0" in text
    realtime = 'sglang:realtime_tokens_total{engine_type="unified",mode="decode",model_name="m",moe_ep_rank="0",'
    realtime += 'pp_rank="0",tp_rank="0"}'
    assert f"{realtime} 8.0" in text
    assert 'sglang:time_to_first_token_seconds_bucket{engine_type="unified",le="1.0",model_name="m"} 1.0' in text
    assert f"sglang:time_to_first_token_seconds_count{{{tok}}} 1.0" in text


def test_scheduler_gauges_absent_until_published() -> None:
    snap = MetricsSnapshot(None, 0, 0, 0, 0, 0, 0, [("+Inf", 0.0)], 0.0, [("+Inf", 0.0)], 0.0)
    text = render(lambda: snap, "m").decode()
    assert "sglang:num_running_reqs" not in text and "sglang:prompt_tokens_total" in text
