"""A leader's `/status` `group` for tests of what reads it (metrics, the CLI)."""

from __future__ import annotations

from supervisor.status.snapshot import GroupNodeView, GroupView

GROUP = GroupView(
    role="leader",
    node_rank=0,
    nnodes=3,
    restart="daemon",
    status="degraded",
    reason="node 2 daemon unreachable for 12 s (connection refused)",
    serves=True,
    nodes=(
        GroupNodeView(node=0, state="ready", pid=100, rung="base"),
        GroupNodeView(node=1, address="h1:8900", state="ready", pid=200, rung="base", stopped_ranks=(201,)),
        GroupNodeView(node=2, address="h2:8900", reachable=False, unreachable_s=12.0, error="connection refused"),
    ),
)
