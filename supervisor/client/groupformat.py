"""The `group` rows of `sglang-supervisor status`: this node's role and, on the leader, every node."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def group_rows(g: Mapping[str, Any] | None) -> list[tuple[str, str]]:
    if not g:
        return []
    head = f"node {g.get('node_rank')} of {g.get('nnodes')} ({g.get('role')}), restart by {g.get('restart')}"
    if g.get("role") == "leader":
        head += f"; group {g.get('status')}" + (" and serving" if g.get("serves") else ", not serving")
        if g.get("status") != "ok" and g.get("reason"):
            head += f" ({g['reason']})"
    elif g.get("leader"):
        head += f"; leader {g['leader']}"
    rows = [("group", head)]
    for n in g.get("nodes") or ():
        where = n.get("address") or "this daemon"
        if not n.get("reachable", True):
            text = f"unreachable for {float(n.get('unreachable_s') or 0):.0f} s ({n.get('error') or 'no answer'})"
            if n.get("state"):
                text += f"; last said {n['state']}"
        else:
            text = f"{n.get('state') or '-'}, pid {n.get('pid') or '-'}, rung {n.get('rung') or '-'}"
            if n.get("cause"):
                text += f", holds {n['cause']}"
            if n.get("stopped_ranks"):
                text += f", stopped (T): {', '.join(str(p) for p in n['stopped_ranks'])}"
        rows.append(("", f"node {n.get('node')} {where}: {text}"))
    return rows
