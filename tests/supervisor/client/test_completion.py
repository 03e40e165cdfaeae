"""`sglang-supervisor completion bash|zsh`: scripts made from the parser, exercised in a real bash."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from supervisor.cli import build_parser
from supervisor.client.completion import script, verbs


def complete(words: list[str]) -> list[str]:
    """What bash offers for `words` (the last one is being typed), with the script sourced."""
    argv = [sys.executable, "-m", "supervisor", "completion", "bash"]
    bash_script = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=30).stdout
    quoted = " ".join(f"'{w}'" for w in words)
    call = f'COMP_WORDS=({quoted}); COMP_CWORD={len(words) - 1}; _sglang_supervisor; echo "${{COMPREPLY[@]}}"'
    prog = f"{bash_script}\n{call}"
    out = subprocess.run(["bash", "-c", prog], capture_output=True, text=True, check=True, timeout=30).stdout
    return out.split()


@pytest.mark.integration  # the CLI and bash, five times each
@pytest.mark.skipif(shutil.which("bash") is None, reason="no bash")
def test_bash_completes_verbs_options_and_event_names() -> None:
    assert complete(["sglang-supervisor", "st"]) == ["status", "stop", "start"]
    assert complete(["sglang-supervisor", "stop", "--w"]) == ["--wait", "--wait-timeout"]
    assert complete(["sglang-supervisor", "events", "--event", "inc"]) == ["incident"]
    assert complete(["sglang-supervisor", "logs", "--fo"]) == ["--follow"]
    assert complete(["sglang-supervisor", "completion", ""]) == ["bash", "zsh"]


def test_every_verb_is_in_both_scripts() -> None:
    parser = build_parser()
    names = list(verbs(parser))
    assert {"status", "logs", "completion", "run", "demo"} <= set(names)
    for shell in ("bash", "zsh"):
        text = script(parser, shell)
        assert all(n in text for n in names)


@pytest.mark.skipif(shutil.which("zsh") is None, reason="no zsh here")
def test_zsh_script_parses() -> None:
    subprocess.run(["zsh", "-n", "-c", script(build_parser(), "zsh")], check=True, timeout=30)
