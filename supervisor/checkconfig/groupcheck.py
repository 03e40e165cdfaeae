"""`check-config` on a `[group]`: one line saying which node this is, and findings where the
server's own multi-node arguments disagree with the group (SGLang would hang at its rendezvous)."""

from __future__ import annotations

from typing import Literal

from supervisor.common.configerror import ConfigError
from supervisor.config.settings import GroupSettings, Settings
from supervisor.group.credentials import load_keys
from supervisor.group.signing import node_key

Level = Literal["error", "warning"]


def group_line(g: GroupSettings) -> str:
    role = "leader" if g.is_leader else "worker"
    peers = ", ".join(f"node {i + 1} {a}" for i, a in enumerate(g.members)) or "-"
    leader = g.leader or "(this node)"
    return f"group: node {g.node_rank} of {g.nnodes} ({role}); leader {leader}; members {peers}; restart {g.restart}"


def group_doc(g: GroupSettings) -> dict[str, object]:
    return {
        "nnodes": g.nnodes,
        "node_rank": g.node_rank,
        "role": "leader" if g.is_leader else "worker",
        "leader": g.leader,
        "members": list(g.members),
        "restart": g.restart,
    }


def group_findings(settings: Settings) -> list[tuple[Level, str, str]]:
    g = settings.group
    if g is None:
        return []
    args = settings.server.args
    out: list[tuple[Level, str, str]] = []
    for key, want in (("nnodes", g.nnodes), ("node-rank", g.node_rank)):
        got = args.get(key)
        if got is None:
            out.append(("warning", f"server.args.{key}", f"not set: SGLang runs one node unless given --{key} {want}"))
        elif str(got) != str(want):
            out.append(("error", f"server.args.{key}", f"{got!r} disagrees with [group] ({want})"))
    try:
        load_keys(g)
    except ConfigError as err:
        key = "group.key_file" if g.key_file and not g.secret_file else "group.secret_file"
        out.append(("error", key, str(err)))
    if "dist-init-addr" not in args:
        out.append(("warning", "server.args.dist-init-addr", "not set: every node needs the rendezvous host:port"))
    return out


def node_key_hex(settings: Settings, node: int) -> str:
    """Node `node`'s key from the group secret (`sglang-supervisor group-key`); ConfigError if none."""
    g = settings.group
    if g is None:
        raise ConfigError("the config has no [group]")
    if not 0 <= node < g.nnodes:
        raise ConfigError(f"--node {node}: the group's nodes are 0..{g.nnodes - 1}")
    keys = load_keys(g)
    if keys.secret is None:
        raise ConfigError("[group] has key_file, not secret_file: only the group secret derives other nodes' keys")
    return node_key(keys.secret, node).hex()


def ask_leader(settings: Settings, timeout_s: float = 5.0) -> tuple[bool, str]:
    """`check-config --group`: the running leader's answer to this node's join, before it starts
    (nothing recorded there). (agrees, the line to print)."""
    import asyncio

    from supervisor.group.members import join_check

    g = settings.group
    if g is None:
        return False, "group: the config has no [group]"
    if g.is_leader:
        return True, "group: this is the leader (node 0): it decides; check-config --group on each worker asks it"
    try:
        return asyncio.run(join_check(settings, timeout_s))
    except ConfigError as err:
        return False, f"group: {err}"
