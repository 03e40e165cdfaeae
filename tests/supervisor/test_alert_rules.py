"""The shipped alert rules (docs/prometheus-alerts.yml) against their unit tests: `promtool test
rules` evaluates each rule over made-up series, where it must fire and where it must not."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

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


def test_runbook_urls_point_at_sections_of_the_operations_guide() -> None:
    rules = [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]
    anchors = _anchors((RULES.parent / "OPERATIONS.md").read_text())
    books = {r["alert"]: r["annotations"].get("runbook_url") for r in rules}
    for name in ("SGLangSupervisorWriteErrors", "SGLangSupervisorLoopErrors", "SGLangEvidenceCaptureErrors"):
        assert books[name], f"{name} has no runbook_url"
    for name, url in books.items():
        if url is None:
            continue
        path, _, anchor = url.partition("#")
        assert path == "docs/OPERATIONS.md" and anchor in anchors, f"{name}: {url} is not a heading there"
