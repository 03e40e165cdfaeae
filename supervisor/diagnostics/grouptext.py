"""The group section of a bundle's summary.txt: which node this is and the other nodes' bundles."""

from __future__ import annotations

from collections.abc import Mapping


def group_text(group: Mapping[str, object]) -> list[str]:
    lines = [
        "",
        f"Group: node {group.get('node')} of {group.get('nnodes')} ({group.get('role')}), "
        f"group incident {group.get('incident')}",
    ]
    nodes = group.get("nodes")
    if isinstance(nodes, list):
        lines.append("Other nodes' bundles (same id on each node's daemon: GET /diagnostics/<id>):")
        for n in nodes:
            if isinstance(n, Mapping):
                lines.append(f"  node {n.get('node')} {n.get('address')}: {n.get('bundle')}")
    return lines
