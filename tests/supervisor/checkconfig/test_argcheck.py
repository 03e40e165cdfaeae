"""check-config: every rung's command line, and its flags checked by SGLang's own parser.

SGLang is not installed here, so the test puts a stand-in `sglang` package (an argparse parser with
SGLang's module layout, `sglang.srt.server_args.ServerArgs.add_cli_args`) on the server
interpreter's path: the mechanism (run the server's interpreter, parse each rung) is the real one.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from supervisor.cli import main
from supervisor.config.settings import settings_from_mapping

FAKE_SERVER_ARGS = '''
class ServerArgs:
    @staticmethod
    def add_cli_args(parser):
        parser.add_argument("--model-path", required=True)
        parser.add_argument("--tp-size", type=int, default=1)
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=30000)
        parser.add_argument("--disable-cuda-graph", action="store_true")
        parser.add_argument("--cuda-graph-max-bs", type=int)
'''


def write_config(tmp_path: Path, fallback: str, *, pythonpath: Path | None) -> Path:
    env = f'env = {{ PYTHONPATH = "{pythonpath}" }}' if pythonpath else ""
    cfg = tmp_path / "c.toml"
    cfg.write_text(
        f"""
[server]
command = ["{sys.executable}", "-m", "sglang.launch_server"]
{env}
[server.args]
model-path = "/m"
tp-size = 2
{fallback}
"""
    )
    return cfg


@pytest.fixture
def fake_sglang(tmp_path: Path) -> Path:
    root = tmp_path / "site"
    pkg = root / "sglang" / "srt"
    pkg.mkdir(parents=True)
    (root / "sglang" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "server_args.py").write_text(FAKE_SERVER_ARGS)
    return root


def test_prints_every_rung_and_accepts_good_flags(tmp_path: Path, fake_sglang: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    cfg = write_config(
        tmp_path, '[[fallback]]\nname = "no-graph"\nargs = { disable-cuda-graph = true }', pythonpath=fake_sglang
    )
    assert main(["check-config", "--config", str(cfg)]) == 0
    out = capsys.readouterr().out
    assert "rung 0 base" in out and "rung 1 no-graph" in out
    assert "--tp-size 2" in out and "--disable-cuda-graph" in out
    assert "parse with SGLang's own parser" in out


def test_typo_in_a_fallback_rung_is_found(tmp_path: Path, fake_sglang: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    cfg = write_config(
        tmp_path, '[[fallback]]\nname = "typo"\nargs = { disable-cuda-grahp = true }', pythonpath=fake_sglang
    )
    assert main(["check-config", "--config", str(cfg)]) == 1
    out = capsys.readouterr().out
    assert "rung typo:" in out and "disable-cuda-grahp" in out


def test_without_sglang_says_it_could_not_check(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    cfg = write_config(tmp_path, "", pythonpath=None)
    assert main(["check-config", "--config", str(cfg)]) == 0
    assert "could not check: sglang is not importable" in capsys.readouterr().out


def test_bad_config_exits_1_naming_the_key(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    cfg = tmp_path / "bad.toml"
    cfg.write_text("[watchdog]\nstartup_stall_s = -1\n")
    assert main(["check-config", "--config", str(cfg)]) == 1
    assert "watchdog.startup_stall_s" in capsys.readouterr().err


def test_run_refuses_a_bad_config_with_exit_2(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    cfg = tmp_path / "bad.toml"
    cfg.write_text("[server]\nport = 99999\n")
    assert main(["run", "--config", str(cfg)]) == 2
    assert "server.port" in capsys.readouterr().err


def test_non_python_command_cannot_be_checked(tmp_path: Path) -> None:
    from supervisor.checkconfig.argcheck import validate_with_engines

    s = settings_from_mapping({"server": {"command": ["/usr/local/bin/launch-sglang.sh"]}})
    ok, msg, _ = validate_with_engines(s)
    assert ok is None and "not a Python interpreter" in msg


def test_a_parser_out_of_reach_for_two_environments_is_said_once(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    # Two rungs with different environments are two parser runs; both fail the same way.
    cfg = write_config(tmp_path, '[[fallback]]\nname = "nccl"\nenv = { NCCL_P2P_DISABLE = "1" }\n', pythonpath=None)
    assert main(["check-config", "--config", str(cfg)]) == 0
    assert capsys.readouterr().out.count("could not check: sglang is not importable") == 1
