"""[group] and `${VAR}` expansion: one config file serves every node of a group."""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest

from supervisor.checkconfig.argcheck import check_rungs, check_rungs_json
from supervisor.common.configerror import ConfigError
from supervisor.config.expand import ExpansionError, expand
from supervisor.config.render import dump_toml, render_rung
from supervisor.config.settings import load_settings, settings_from_mapping

LWS = {"LWS_LEADER_ADDRESS": "sglang-0.sglang", "LWS_GROUP_SIZE": "2", "LWS_WORKER_INDEX": "1"}
ONE_FILE = """
[server]
command = ["python3", "-m", "sglang.launch_server"]
[server.args]
model-path = "/models/m"
nnodes = "${LWS_GROUP_SIZE}"
node-rank = "${LWS_WORKER_INDEX}"
dist-init-addr = "${LWS_LEADER_ADDRESS}:20000"
[group]
nnodes = "${LWS_GROUP_SIZE}"
node_rank = "${LWS_WORKER_INDEX}"
leader = "${LWS_LEADER_ADDRESS}:8900"
members = ["sglang-0-1.sglang:8900"]
restart = "${RESTART_MODE:-lws}"
"""


def _write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "c.toml"
    p.write_text(text)
    return p


def test_one_file_serves_every_node(tmp_path: Path) -> None:
    path = _write(tmp_path, ONE_FILE)
    worker = load_settings(path, env=LWS)
    assert worker.group is not None
    assert (worker.group.nnodes, worker.group.node_rank, worker.group.is_leader) == (2, 1, False)
    assert worker.group.leader == "sglang-0.sglang:8900"
    assert worker.group.restart == "lws"  # the default after ":-"
    argv = render_rung(worker.server, worker.ladder[0]).argv
    assert argv[argv.index("--dist-init-addr") + 1] == "sglang-0.sglang:20000"
    assert argv[argv.index("--node-rank") + 1] == "1"
    leader = load_settings(path, env={**LWS, "LWS_WORKER_INDEX": "0", "RESTART_MODE": "daemon"})
    assert leader.group is not None and leader.group.is_leader and leader.group.restart == "daemon"


def test_unset_variable_names_key_and_variable(tmp_path: Path) -> None:
    path = _write(tmp_path, ONE_FILE)
    with pytest.raises(ConfigError) as err:
        load_settings(path, env={"LWS_GROUP_SIZE": "2", "LWS_WORKER_INDEX": "1"})
    assert "LWS_LEADER_ADDRESS" in str(err.value)
    assert "server.args.dist-init-addr" in str(err.value)


def test_a_non_number_for_an_int_key_is_refused_by_name(tmp_path: Path) -> None:
    path = _write(tmp_path, ONE_FILE)
    with pytest.raises(ConfigError, match=r"group\.node_rank"):
        load_settings(path, env={**LWS, "LWS_WORKER_INDEX": "one"})


def test_expansion_rules() -> None:
    env = {"A": "x", "EMPTY": ""}
    assert expand("${A}-${B:-d}-$${A}", env) == "x-d-${A}"
    assert expand("${EMPTY:-fallback}", env) == "fallback"
    assert expand(["${A}", {"k": "${A}"}], env) == ["x", {"k": "x"}]
    assert expand("${N}", {"N": "7"}, frozenset({"p"}), "p") == 7
    assert expand("port ${N}", {"N": "7"}, frozenset({"p"}), "p") == "port 7"  # not only an expansion
    assert expand("${N}", {"N": "7"}) == "7"  # not an int key: stays a string
    with pytest.raises(ExpansionError, match=r"s\.k: \$\{NOPE\}"):
        expand({"s": {"k": "${NOPE}"}}, env)


def test_without_group_nothing_changes(tmp_path: Path) -> None:
    s = load_settings(_write(tmp_path, "[server]\nport = 30001\n"), env={})
    assert s.group is None
    assert "[group]" not in dump_toml(s)


@pytest.mark.parametrize(
    "group,needle",
    [
        ({"nnodes": 1, "node_rank": 0}, "group.nnodes"),
        ({"nnodes": 2, "node_rank": 2, "leader": "a:1"}, "node_rank 2 is not below nnodes 2"),
        ({"nnodes": 3, "node_rank": 0, "members": ["a:1"]}, "needs members"),
        ({"nnodes": 2, "node_rank": 1}, "needs leader"),
        ({"nnodes": 2, "node_rank": 1, "leader": "no-port"}, "not host:port"),
        ({"nnodes": 2, "node_rank": 0, "members": ["a:99999"]}, "not host:port"),
        ({"nnodes": 2, "node_rank": 0, "members": ["a:1"], "restart": "k8s"}, "group.restart"),
        ({"nnodes": 2, "node_rank": 0, "members": ["a:1"], "bogus": 1}, "group.bogus"),
    ],
)
def test_bad_groups_are_refused_by_name(group: dict[str, object], needle: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(needle)):
        settings_from_mapping({"group": group})


def test_group_roundtrips_through_toml(tmp_path: Path) -> None:
    s = settings_from_mapping({"group": {"nnodes": 3, "node_rank": 0, "members": ["h1:8900", "[::1]:8901"]}})
    again = load_settings(_write(tmp_path, dump_toml(s)), env={})
    assert again == s


def test_check_config_shows_the_group_and_disagreeing_args(tmp_path: Path) -> None:
    path = _write(tmp_path, ONE_FILE.replace('node-rank = "${LWS_WORKER_INDEX}"', "node-rank = 0"))
    s = load_settings(path, env=LWS)
    out = io.StringIO()
    code = check_rungs(s, validate=False, out=out, env={})
    text = out.getvalue()
    assert "group: node 1 of 2 (worker); leader sglang-0.sglang:8900" in text
    assert "error: server.args.node-rank: 0 disagrees with [group] (1)" in text
    assert code == 1
    out = io.StringIO()
    check_rungs_json(s, validate=False, out=out, env={})
    assert '"role": "worker"' in out.getvalue()
