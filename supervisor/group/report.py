"""This node's report for the leader (`GET /group/report`), and its wire form.

Built from what the daemon already published (the status snapshot) plus the verdict a member holds
for the leader. Parsing a member's answer validates it: a member that answers garbage is treated
as unreachable, never as a crash of the leader.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict
from typing import Any

from pydantic import TypeAdapter, ValidationError

from supervisor.group.verdict import NodeReport, RankView
from supervisor.status.causes import Cause
from supervisor.status.snapshot import StatusSnapshot

_ADAPTER = TypeAdapter(NodeReport)
_RANK_ROLES = frozenset({"main", "scheduler", "detokenizer", "controller"})


def build_report(
    node: int,
    snap: StatusSnapshot,
    *,
    cause: Cause | None,
    reason: str,
    lost_ranks: Iterable[int],
    at: float,
    incident: str | None,
    instance: str = "",
    fingerprint: Mapping[str, str] | None = None,
    identity: str = "",
) -> NodeReport:
    ranks = tuple(RankView(p.pid, p.role, p.rank, p.status) for p in snap.processes if p.role in _RANK_ROLES)
    return NodeReport(
        node=node,
        state=snap.state,
        phase=snap.phase,
        pid=snap.pid,
        rung=snap.rung or "",
        cause=cause,
        reason=reason or snap.reason,
        ranks=ranks,
        lost_ranks=tuple(sorted(lost_ranks)),
        last_progress_s=snap.last_progress_s,
        at=at,
        incident=incident,
        instance=instance,
        identity=identity,
        fingerprint=dict(fingerprint or {}),
    )


def to_wire(report: NodeReport) -> dict[str, Any]:
    return asdict(report)


def from_wire(doc: Mapping[str, Any]) -> NodeReport:
    """A member's report, validated; ValueError names what is wrong with it."""
    try:
        return _ADAPTER.validate_python(dict(doc))
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "(report)"
        raise ValueError(f"malformed report: {where}: {first['msg']}") from None
