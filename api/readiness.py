"""What "ready" means for `GET /readyz` (and a Kubernetes readiness probe): one rule, one place.

The server is ready when it serves: state `ready` or `degraded`. On a multi-node group's leader,
ready means the group serves (`GroupView.serves`: every reachable node serving, and node 0's own server
not failing while the group waits for a node, docs/MULTINODE.md).
"""

from __future__ import annotations

from supervisor.policy.lifecycle import SERVING_NAMES
from supervisor.status.snapshot import StatusSnapshot


def is_ready(snapshot: StatusSnapshot) -> bool:
    """Whether traffic may be sent: the server this daemon watches serves (on a leader: the group)."""
    if snapshot.group is not None:
        return snapshot.group.serves
    return snapshot.state in SERVING_NAMES
