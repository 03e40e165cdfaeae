"""An `[[notify]]` exec hook for integration tests: a script that appends each event it is handed
(its stdin and its SGLANG_SUPERVISOR_* environment) to a file the test reads."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from supervisor.config.alerting import NotifyTarget
from supervisor.config.settings import Settings

HOOK = """
import json, os, sys
event = json.load(sys.stdin)
env = {k: v for k, v in os.environ.items() if k.startswith("SGLANG_SUPERVISOR_")}
with open(sys.argv[1], "a") as f:
    f.write(json.dumps({"stdin": event, "env": env}) + "\\n")
"""


def hook(tmp_path: Path) -> tuple[Path, tuple[str, ...]]:
    """The file the hook writes and its argv."""
    script = tmp_path / "hook.py"
    script.write_text(HOOK)
    out = tmp_path / "hook.jsonl"
    return out, (sys.executable, str(script), str(out))


def hook_calls(out: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in out.read_text().splitlines()] if out.exists() else []


def with_notify(s: Settings, *targets: NotifyTarget) -> Settings:
    return s.model_copy(update={"notify": targets})
