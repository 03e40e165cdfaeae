"""`--json` on the verbs that are not client calls: check-config prints one JSON document."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from supervisor.cli import main


def test_check_config_json_redacts_and_reports(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text(
        '[server]\ncommand = ["/bin/true"]\nenv = { HF_TOKEN = "hf_verysecretvalue" }\n'
        '[server.args]\napi-key = "sk-secretsecret"\n[[fallback]]\nname = "b"\nargs = { x = 1 }\n'
    )
    assert main(["check-config", "--config", str(cfg), "--json", "--no-sglang"]) == 0
    out = capsys.readouterr().out
    doc = json.loads(out)
    assert [r["name"] for r in doc["rungs"]] == ["base", "b"] and doc["ok"] is True
    assert "secret" not in out and doc["rungs"][0]["env"]["HF_TOKEN"] == "[redacted]"
    cfg.write_text("[server]\nport = 'x'\n")
    assert main(["check-config", "--config", str(cfg), "--json"]) == 1
    bad = json.loads(capsys.readouterr().out)
    assert bad["ok"] is False and "server.port" in bad["refused"]
