"""The shipped Grafana dashboard: no unused inputs, the State panels coloured per state by value
mappings (evaluated by promtool over made-up series), and the serving-stall, incident and
daemon-health views."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from api.pagehtml import STATE_COLOURS
from supervisor.policy.lifecycle import State

DASHBOARD = Path(__file__).resolve().parents[2] / "docs" / "grafana-dashboard.json"


def panels() -> list[dict[str, Any]]:
    return list(json.loads(DASHBOARD.read_text())["panels"])


def state_panels() -> list[dict[str, Any]]:
    return [p for p in panels() if p["title"] in ("State", "State over time")]


def test_no_unused_datasource_input() -> None:
    text = DASHBOARD.read_text()
    assert "__inputs" not in json.loads(text) and "DS_PROMETHEUS" not in text


def test_every_state_has_its_colour_the_status_pages() -> None:
    assert len(state_panels()) == 2
    for p in state_panels():
        [mapping] = p["fieldConfig"]["defaults"]["mappings"]
        by_text = {o["text"]: o["color"] for o in mapping["options"].values()}
        assert set(by_text) == {s.value for s in State}
        assert by_text == STATE_COLOURS, "the dashboard and the status page colour states alike"
        for red in ("hung", "failed"):
            r, g, b = (int(by_text[red][i : i + 2], 16) for i in (1, 3, 5))
            assert r > 2 * g and r > 2 * b


def test_the_stall_incident_and_daemon_views_exist() -> None:
    titles = {p["title"].lower(): p for p in panels()}
    stall = next(p for t, p in titles.items() if "serving stall" in t)
    exprs = " ".join(t["expr"] for t in stall["targets"])
    assert "running_requests" in exprs and "generation_tokens_per_second" in exprs
    incidents = next(p for t, p in titles.items() if "bundle" in t)
    assert "sglang_supervisor_last_incident_info" in incidents["targets"][0]["expr"]
    health = " ".join(t["expr"] for t, p in titles.items() if "daemon health" in t for t in p["targets"])
    for name in ("process_resident_memory_bytes", "process_cpu_seconds_total", "process_open_fds", "loop_errors"):
        assert name in health, name


@pytest.mark.skipif(
    shutil.which("promtool") is None, reason="promtool not installed (Debian: apt-get install prometheus)"
)
def test_the_state_query_yields_each_states_mapped_value(tmp_path: Path) -> None:
    panel = state_panels()[0]
    expr = panel["targets"][0]["expr"].replace("$instance", ".*")
    options = panel["fieldConfig"]["defaults"]["mappings"][0]["options"]
    code = {o["text"]: int(value) for value, o in options.items()}
    tests = []
    for current in State:
        series = [
            {
                "series": f'sglang_supervisor_state{{instance="a", state="{s.value}"}}',
                "values": "1" if s == current else "0",
            }
            for s in State
        ]
        tests.append(
            {
                "interval": "1m",
                "input_series": series,
                "promql_expr_test": [
                    {
                        "expr": expr,
                        "eval_time": "0m",
                        "exp_samples": [{"labels": '{instance="a"}', "value": code[current.value]}],
                    }
                ],
            }
        )
    (tmp_path / "rules.yml").write_text("groups: []\n")
    (tmp_path / "t.yml").write_text(yaml.safe_dump({"rule_files": ["rules.yml"], "tests": tests}))
    result = subprocess.run(
        ["promtool", "test", "rules", "t.yml"], cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
