"""The group-relevant part of a node's config, as a fingerprint the leader compares (issue 34).

Every node of a group must run the same server: the same ladder, each rung with the same rendered
arguments, the same `nnodes`, `tp-size` and rendezvous. What may differ per node is its own: its
`node-rank`, and its server's `--host`/`--port` (a worker's port is its dummy health server's).
Each key's value is short and readable where it is a figure (`nnodes`, `tp-size`, `ladder`) and a
digest where it is a command line (`rung.<name>`), so a refusal can say what differs. Pure.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence

from supervisor.config.render import render_rung
from supervisor.config.settings import Settings

NODE_LOCAL_FLAGS = frozenset({"--node-rank", "--host", "--port"})


def _drop_local(argv: Sequence[str]) -> list[str]:
    out: list[str] = []
    skip = False
    for a in argv:
        if skip:
            skip = False
            continue
        flag = a.split("=", 1)[0]
        if flag in NODE_LOCAL_FLAGS:
            skip = "=" not in a
            continue
        out.append(a)
    return out


def argv_print(argv: Sequence[str]) -> str:
    """A command line's digest without its node-local flags (16 hex digits)."""
    return hashlib.sha256(json.dumps(_drop_local(argv)).encode()).hexdigest()[:16]


def fingerprint(settings: Settings) -> dict[str, str]:
    """The group-relevant config of this node (its own rank aside)."""
    g = settings.group
    args = settings.server.args
    out = {
        "nnodes": str(g.nnodes if g is not None else 1),
        "server.args.nnodes": str(args.get("nnodes", "")),
        "tp-size": str(args.get("tp-size", args.get("tp", ""))),
        "dist-init-addr": str(args.get("dist-init-addr", "")),
        "ladder": ",".join(r.name for r in settings.ladder),
    }
    for rung in settings.ladder:
        out[f"rung.{rung.name}"] = argv_print(render_rung(settings.server, rung).argv)
    return out


def differing(leader: Mapping[str, str], member: Mapping[str, str]) -> list[str]:
    """The keys whose values differ (or that one side lacks), each with both values: named."""
    out: list[str] = []
    for key in sorted(set(leader) | set(member)):
        a, b = leader.get(key), member.get(key)
        if a != b:
            out.append(f"{key} (leader {a if a is not None else 'none'}, this node {b if b is not None else 'none'})")
    return out
