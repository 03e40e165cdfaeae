"""A member daemon for the group API's tests: a snapshot, a report and a command queue, no process."""

from __future__ import annotations

from dataclasses import dataclass, field

from supervisor.group.verdict import NodeReport, RankView
from supervisor.status.commands import Command, CommandResult
from supervisor.status.snapshot import StatusSnapshot, StopView


@dataclass
class FakeDaemon:
    state: str = "ready"
    results: dict[str, CommandResult] = field(default_factory=dict)
    submitted: list[Command] = field(default_factory=list)
    stops_after: int = 0  # snapshots until a stop shows `stopped`

    def snapshot(self) -> StatusSnapshot:
        if self.stops_after > 0:
            self.stops_after -= 1
            if self.stops_after == 0:
                self.state = "stopped"
        stop = StopView(at="2026-12-01T17:00:00Z", port_free=True) if self.state == "stopped" else None
        return StatusSnapshot(state=self.state, ladder=("base", "safe"), last_stop=stop)

    def group_report(self) -> NodeReport:
        return NodeReport(
            1, self.state, "serving", 42, "base", None, "", (RankView(43, "scheduler", 1, "stopped"),), (), 0.2, 1.0
        )

    async def submit(self, command: Command) -> CommandResult:
        self.submitted.append(command)
        return self.results.get(command.kind, CommandResult("accepted", "ok", self.state))
