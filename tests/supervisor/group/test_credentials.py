"""A group's credentials (supervisor/group/credentials.py) and `sglang-supervisor group-key`."""

from __future__ import annotations

from pathlib import Path

import pytest

from supervisor.cli import main
from supervisor.common.configerror import ConfigError
from supervisor.config.render import dump_toml
from supervisor.config.settings import GroupSettings, settings_from_mapping
from supervisor.group.credentials import NO_CREDENTIALS, load_keys
from supervisor.group.signing import node_key


def private(path: Path, text: str, mode: int = 0o600) -> str:
    path.write_text(text + "\n")
    path.chmod(mode)
    return str(path)


def test_a_group_without_credentials_is_refused_naming_what_to_set() -> None:
    for g in (
        GroupSettings(nnodes=2, node_rank=0, members=("h1:1",)),
        GroupSettings(nnodes=2, node_rank=1, leader="h0:1"),
    ):
        with pytest.raises(ConfigError) as err:
            load_keys(g)
        assert str(err.value) == NO_CREDENTIALS and "secret_file" in NO_CREDENTIALS and "key_file" in NO_CREDENTIALS


def test_unusable_secrets_are_refused_by_name(tmp_path: Path) -> None:
    cases = {
        "chmod 600": private(tmp_path / "open", "a-long-enough-group-secret", 0o644),
        "at least 16": private(tmp_path / "short", "short"),
        "cannot read it": str(tmp_path / "absent"),
        "without spaces": private(tmp_path / "spaces", "two words here and there"),
    }
    for why, path in cases.items():
        with pytest.raises(ConfigError, match=why):
            load_keys(GroupSettings(nnodes=2, node_rank=0, members=("h1:1",), secret_file=path))
    with pytest.raises(ValueError, match="not key_file"):
        GroupSettings(nnodes=2, node_rank=0, members=("h1:1",), key_file=path)


def test_each_node_has_its_own_key_and_a_worker_may_hold_only_its_own(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    secret = private(tmp_path / "secret", "the-group-secret-of-this-test")
    leader = load_keys(GroupSettings(nnodes=3, node_rank=0, members=("h1:1", "h2:1"), secret_file=secret))
    assert len({leader.key(0), leader.key(1), leader.key(2)}) == 3
    assert leader.key(1) == node_key(b"the-group-secret-of-this-test", 1)
    assert "the-group-secret" not in repr(leader)
    # `group-key` prints node 1's key from the leader's config; a worker holds only that.
    data = {"server": {"command": ["x"]}, "paths": {"state_dir": str(tmp_path / "s")},
            "group": {"nnodes": 3, "node_rank": 0, "members": ["h1:1", "h2:1"], "secret_file": secret}}  # fmt: skip
    cfg = tmp_path / "leader.toml"
    cfg.write_text(dump_toml(settings_from_mapping(data)))
    assert main(["group-key", "--config", str(cfg), "--node", "1"]) == 0
    printed = capsys.readouterr().out.strip()
    assert printed == leader.key(1).hex()
    worker = load_keys(GroupSettings(nnodes=3, node_rank=1, leader="h0:1", key_file=private(tmp_path / "k1", printed)))
    assert worker.key(1) == leader.key(1) and worker.secret is None
    with pytest.raises(LookupError):
        worker.key(2)  # node 1 cannot speak as node 2
    assert main(["group-key", "--config", str(cfg), "--node", "3"]) == 1
    bad = private(tmp_path / "kbad", "not-hex-at-all")
    with pytest.raises(ConfigError, match="64 hex digits"):
        load_keys(GroupSettings(nnodes=3, node_rank=1, leader="h0:1", key_file=bad))
