"""The client finds the daemon from [api] alone, wherever the config comes from."""

from __future__ import annotations

from pathlib import Path

import pytest

from supervisor.client.locate import ClientConfigError, api_settings, choose_config


def test_flag_then_environment_then_the_installed_path(tmp_path: Path) -> None:
    installed = tmp_path / "etc.toml"
    assert choose_config(None, {}, installed).path is None  # nothing installed: the defaults
    installed.write_text("")
    assert choose_config(None, {}, installed).path == installed
    env = {"SGLANG_SUPERVISOR_CONFIG": "/x/env.toml"}
    assert choose_config(None, env, installed).path == Path("/x/env.toml")
    chosen = choose_config("/x/flag.toml", env, installed)
    assert chosen.path == Path("/x/flag.toml") and chosen.explicit


def test_only_api_is_read_and_the_rest_may_be_wrong(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text('[watchdog]\nstartup_stal_s = "typo"\n[bogus]\nx = 1\n[api]\nport = 8911\nhost = "::"\nextra = 1\n')
    api, notes = api_settings(cfg)
    assert (api.port, api.host) == (8911, "::") and notes == [f"{cfg}: ignoring unknown key api.extra"]


@pytest.mark.parametrize(
    ("text", "words"),
    [("[api]\nport = 'x'\n", "api.port"), ("[api\n", "not valid TOML"), ("api = 3\n", "[api] must be a table")],
)
def test_what_the_client_cannot_use_is_named(tmp_path: Path, text: str, words: str) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text(text)
    with pytest.raises(ClientConfigError, match=words.replace("[", r"\[").replace("]", r"\]")):
        api_settings(cfg)
    with pytest.raises(ClientConfigError, match="cannot read config"):
        api_settings(tmp_path / "missing.toml")
