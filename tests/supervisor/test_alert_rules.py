"""The shipped alert rules (docs/prometheus-alerts.yml) against their unit tests: `promtool test
rules` evaluates each rule over made-up series, where it must fire and where it must not."""

from __future__ import annotations

import shutil
import socket
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

HERE = Path(__file__).resolve().parent
RULES = HERE.parents[1] / "docs" / "prometheus-alerts.yml"
TESTS = HERE / "promtool" / "alerts_test.yml"


def test_every_rule_has_a_firing_and_a_quiet_case() -> None:
    rules = {r["alert"] for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]}
    fires: set[str] = set()
    quiet: set[str] = set()
    for case in yaml.safe_load(TESTS.read_text())["tests"]:
        for check in case.get("alert_rule_test", []):
            (fires if check.get("exp_alerts") else quiet).add(check["alertname"])
    assert rules - fires == set(), "rules with no firing case"
    assert rules - quiet == set(), "rules with no case where they stay quiet"
    assert fires | quiet <= rules, "tests of rules that do not exist"


@pytest.mark.skipif(
    shutil.which("promtool") is None, reason="promtool not installed (Debian: apt-get install prometheus)"
)
def test_promtool_unit_tests_pass() -> None:
    result = subprocess.run(
        ["promtool", "test", "rules", TESTS.name], cwd=TESTS.parent, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout + result.stderr


def _anchors(markdown: str) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to dashes."""
    import re

    heads = re.findall(r"^#+\s+(.+?)\s*$", markdown, re.M)
    return {re.sub(r"[^a-z0-9 _-]", "", h.lower()).replace(" ", "-") for h in heads}


RUNBOOK = RULES.parent / "RUNBOOK.md"
BASE_LABEL = "sglang_supervisor_runbooks"
DEFAULT_BASE = "https://runbooks.invalid/sglang-supervisor/RUNBOOK.md"


def runbook_url(alert: str) -> str:
    """The one form every rule's link takes: the base from the external label (or the placeholder),
    then the alert's section of docs/RUNBOOK.md."""
    return f'{{{{ or $externalLabels.{BASE_LABEL} "{DEFAULT_BASE}" }}}}#{alert.lower()}'


def _rules() -> list[dict[str, Any]]:
    return [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]


def test_every_alert_has_a_runbook_section_under_the_configurable_base() -> None:
    anchors = _anchors(RUNBOOK.read_text())
    rules = _rules()
    assert len(rules) >= 17
    for rule in rules:
        name = rule["alert"]
        assert rule["annotations"].get("runbook_url") == runbook_url(name), f"{name}: {rule['annotations']}"
        assert name.lower() in anchors, f"{name}: docs/RUNBOOK.md has no section '## {name}'"


def test_the_runbook_s_references_to_the_operations_guide_exist() -> None:
    """RUNBOOK.md sends the reader to sections of OPERATIONS.md by their titles: each one is there."""
    import re

    titles = set(re.findall(r"^#+\s+(.+?)\s*$", (RULES.parent / "OPERATIONS.md").read_text(), re.M))
    cited = re.findall(r'docs/OPERATIONS\.md, "([^"]+)"', re.sub(r"\s+", " ", RUNBOOK.read_text()))
    assert cited, "the check would pass on nothing"
    assert set(cited) <= titles, set(cited) - titles


PROMETHEUS = shutil.which("prometheus")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.mark.integration
@pytest.mark.skipif(PROMETHEUS is None, reason="prometheus not installed (Debian: apt-get install prometheus)")
def test_a_real_prometheus_links_to_the_base_its_external_label_names(tmp_path: Path) -> None:
    """promtool cannot set external labels (2.42), so the shipped rules run in a real Prometheus
    whose only target is a daemon that is down: SGLangSupervisorDown fires (its `for:` shortened in
    this copy) with the link built on the configured base."""
    import re
    import time

    import httpx

    assert PROMETHEUS is not None
    base = "https://git.example.com/ops/sglang-supervisor/blob/v0.2.0/docs/RUNBOOK.md"
    rules = tmp_path / "rules.yml"
    rules.write_text(re.sub(r"^(\s+)for: \S+$", r"\1for: 0s", RULES.read_text(), flags=re.M))
    web, dead = _free_port(), _free_port()
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s", "external_labels": {BASE_LABEL: base}},
        "rule_files": [str(rules)],
        "scrape_configs": [{"job_name": "sglang-supervisor", "static_configs": [{"targets": [f"127.0.0.1:{dead}"]}]}],
    }
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    cmd = [
        PROMETHEUS, f"--config.file={tmp_path / 'prometheus.yml'}", f"--storage.tsdb.path={tmp_path / 'data'}",
        f"--web.listen-address=127.0.0.1:{web}", "--log.level=warn",
    ]  # fmt: skip
    log = tmp_path / "prometheus.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline, alerts = time.monotonic() + 90, []
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                answer = httpx.get(f"http://127.0.0.1:{web}/api/v1/alerts", timeout=5).json()
                alerts = [a for a in answer["data"]["alerts"] if a["labels"]["alertname"] == "SGLangSupervisorDown"]
            except (httpx.HTTPError, ValueError, KeyError):
                alerts = []
            if alerts:
                break
            time.sleep(0.5)
        assert alerts, f"SGLangSupervisorDown never fired; prometheus said: {log.read_text()[-2000:]}"
        assert alerts[0]["annotations"]["runbook_url"] == f"{base}#sglangsupervisordown"
    finally:
        proc.terminate()
        proc.wait(timeout=30)
