"""Settings: the example configs parse, bad configs name the key, rung rendering."""

from __future__ import annotations

from pathlib import Path

import pytest

from supervisor.common.configerror import ConfigError
from supervisor.config.render import render_rung
from supervisor.config.settings import Rung, ServerSettings, load_settings, settings_from_mapping

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize("path", sorted((ROOT / "systemd").glob("*.toml")) + sorted((ROOT / "docs").glob("*.toml")))
def test_shipped_configs_parse(path: Path) -> None:
    s = load_settings(path)
    assert s.ladder[0].name == "base"


@pytest.mark.parametrize(
    "data,key",
    [
        ({"watchdog": {"startup_stall_s": -5}}, "watchdog.startup_stall_s"),
        ({"server": {"port": 70000}}, "server.port"),
        ({"server": {"port": "30000"}}, "server.port"),
        ({"server": {"command": []}}, "server.command"),
        ({"watchdog": {"stall": 5}}, "watchdog.stall"),
        ({"bogus": {}}, "bogus"),
        ({"fallback": [{"name": "a"}, {"name": "a"}]}, "fallback"),
        ({"fallback": [{"name": "base"}]}, "fallback"),
        ({"fallback": [{"name": "x", "on": ["gremlins"]}]}, "fallback.0.on"),
        ({"fallback": [{"name": "x", "args": {"--tp": 2}}]}, "fallback.0.args"),
        ({"server": {"args": {"port": 1}}}, "server.args"),
        ({"restart": {"release_policy": "maybe"}}, "restart.release_policy"),
        ({"diagnostics": {"gdb": "sometimes"}}, "diagnostics.gdb"),
        ({"watchdog": {"startup_stall_s": 100, "startup_timeout_s": 50}}, "watchdog"),
        ({"api": {"port": 0}}, "api.port"),
    ],
)
def test_bad_config_names_the_key(data: dict[str, object], key: str) -> None:
    with pytest.raises(ConfigError) as err:
        settings_from_mapping(data)
    assert key in str(err.value)


def test_bad_toml_and_missing_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[server\nport = 1")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_settings(bad)
    with pytest.raises(ConfigError, match="cannot read"):
        load_settings(tmp_path / "missing.toml")
    bad.write_bytes(b"\xff\xfe[server]")
    with pytest.raises(ConfigError):
        load_settings(bad)


SERVER = ServerSettings(
    command=("python3", "-m", "sglang.launch_server"),
    port=31000,
    args={"model-path": "/m", "tp-size": 8, "enable-metrics": True, "cuda-graph-max-bs": 160, "log-requests": False},
    env={"NCCL_DEBUG": "WARN"},
)


@pytest.mark.parametrize(
    "rung,has,lacks,env",
    [
        (
            Rung(name="base"),
            ["--tp-size", "8", "--enable-metrics", "--cuda-graph-max-bs", "160"],
            ["--log-requests"],
            {},
        ),
        (
            Rung(name="r", args={"disable-cuda-graph": True}, drop=("cuda-graph-max-bs",)),
            ["--disable-cuda-graph"],
            ["--cuda-graph-max-bs"],
            {},
        ),
        (Rung(name="r", args={"tp-size": 4, "enable-metrics": False}), ["4"], ["--enable-metrics", "8"], {}),
        (Rung(name="r", env={"NCCL_P2P_DISABLE": "1"}), [], [], {"NCCL_P2P_DISABLE": "1"}),
        (Rung(name="r", args={"cuda-graph-bs": [1, 2, 4]}), ["--cuda-graph-bs", "1", "2", "4"], [], {}),
    ],
)
def test_render(rung: Rung, has: list[str], lacks: list[str], env: dict[str, str]) -> None:
    r = render_rung(SERVER, rung)
    assert r.argv[:3] == ("python3", "-m", "sglang.launch_server")
    assert r.argv[-4:] == ("--host", "127.0.0.1", "--port", "31000")
    for tok in has:
        assert tok in r.argv
    for tok in lacks:
        assert tok not in r.argv
    assert r.env == {"NCCL_DEBUG": "WARN", **env}
    joined = " ".join(r.argv)
    for tok in has:
        assert tok in joined


def test_dump_toml_round_trips(tmp_path: Path) -> None:
    from supervisor.config.render import dump_toml

    s = load_settings(ROOT / "systemd" / "config.example.toml")
    out = tmp_path / "again.toml"
    out.write_text(dump_toml(s))
    assert load_settings(out) == s
