"""`[server] engine` and a rung's own `engine` and `command`: what each rung runs (issue 37)."""

from __future__ import annotations

import pytest

from supervisor.config.render import render_ladder
from supervisor.config.settings import ConfigError, settings_from_mapping

SIM = ["python3", "-m", "supervisor.simulator"]


def test_the_default_engine_is_sglang_with_its_own_command() -> None:
    s = settings_from_mapping({"server": {"args": {"model-path": "/m"}}})
    assert s.server.engine == "sglang" and s.engine_of(s.ladder[0]) == "sglang"
    assert render_ladder(s)[0].argv[:3] == ("python3", "-m", "sglang.launch_server")


def test_engine_vllm_without_a_command_runs_vllms_own_server() -> None:
    s = settings_from_mapping({"server": {"engine": "vllm", "args": {"model": "/m"}}})
    argv = render_ladder(s)[0].argv
    assert argv[:3] == ("python3", "-m", "vllm.entrypoints.openai.api_server")
    assert argv[3:5] == ("--model", "/m") and argv[-4:] == ("--host", "127.0.0.1", "--port", "30000")


def test_a_rung_that_changes_engine_starts_from_its_own_args_and_its_engines_command() -> None:
    s = settings_from_mapping(
        {
            "server": {
                "args": {"model-path": "/m", "speculative-algorithm": "EAGLE3", "tp-size": 8},
                "env": {"A": "1"},
            },
            "fallback": [
                {"name": "no-graph", "args": {"disable-cuda-graph": True}},
                {"name": "vllm-plain", "engine": "vllm", "args": {"model": "/m", "tensor-parallel-size": 8},
                 "env": {"B": "2"}},
            ],
        }
    )  # fmt: skip
    _base, no_graph, plain = render_ladder(s)
    assert "--speculative-algorithm" in no_graph.argv and "--disable-cuda-graph" in no_graph.argv
    assert plain.argv == (
        "python3", "-m", "vllm.entrypoints.openai.api_server", "--model", "/m", "--tensor-parallel-size", "8",
        "--host", "127.0.0.1", "--port", "30000",
    )  # fmt: skip
    assert plain.env == {"A": "1", "B": "2"}  # the environment still layers over the base's
    assert [s.engine_of(r) for r in s.ladder] == ["sglang", "sglang", "vllm"]


def test_a_rung_with_its_own_command_runs_it_with_its_own_args_only() -> None:
    s = settings_from_mapping(
        {
            "server": {"command": SIM, "args": {"model-path": "/m"}},
            "fallback": [
                {"name": "v", "engine": "vllm", "command": [*SIM, "--engine", "vllm"], "args": {"model": "/m"}}
            ],
        }
    )
    assert render_ladder(s)[1].argv[:7] == (*SIM, "--engine", "vllm", "--model", "/m")


def test_drop_with_an_own_set_is_refused_naming_why() -> None:
    with pytest.raises(ConfigError, match="starts from its own empty set"):
        settings_from_mapping({"fallback": [{"name": "v", "engine": "vllm", "drop": ["tp-size"]}]})


def test_an_unknown_engine_is_refused_with_the_key() -> None:
    with pytest.raises(ConfigError, match=r"server\.engine"):
        settings_from_mapping({"server": {"engine": "tgi"}})
    with pytest.raises(ConfigError, match="fallback"):
        settings_from_mapping({"fallback": [{"name": "x", "engine": "trt"}]})


def test_a_group_refuses_a_vllm_rung_naming_it() -> None:
    group = {"nnodes": 2, "node_rank": 0, "members": ["10.0.0.2:8900"], "secret_file": "/etc/s"}
    with pytest.raises(ConfigError, match="vllm-plain"):
        settings_from_mapping(
            {"group": group, "fallback": [{"name": "vllm-plain", "engine": "vllm", "args": {"model": "/m"}}]}
        )
