"""What "ready" means for `GET /readyz` (and a Kubernetes readiness probe): one rule, one place.

Today the server is ready when it serves: state `ready` or `degraded`. A multi-node group
replaces this rule here (the leader: the group serves), and nothing else needs to change.
"""

from __future__ import annotations

from supervisor.daemon.snapshot import StatusSnapshot
from supervisor.policy.lifecycle import SERVING

SERVING_STATES = frozenset(s.value for s in SERVING)


def is_ready(snapshot: StatusSnapshot) -> bool:
    """Whether traffic may be sent: the server this daemon watches is serving."""
    return snapshot.state in SERVING_STATES
