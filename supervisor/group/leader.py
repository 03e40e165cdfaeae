"""What node 0's daemon keeps about its members, and how it asks them all at once.

The latest report of every member comes from a poller that runs beside the supervisor loop (one
request per member per poll, each bounded by `request_timeout_s`), so a partitioned member costs
the loop nothing. A group incident asks every member concurrently: capture under one incident id,
then stop and verify, then launch one rung. Reports taken before a group stop or launch are
dropped (`generation`): a verdict the old servers earned must not judge the new ones.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import structlog

from supervisor.config.settings import GroupSettings
from supervisor.group.client import Answer, GroupClient
from supervisor.group.report import from_wire
from supervisor.group.verdict import MemberView

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class Timeouts:
    report_s: float
    capture_s: float
    stop_s: float
    launch_s: float


class GroupLeader:
    def __init__(
        self,
        group: GroupSettings,
        client: GroupClient,
        timeouts: Timeouts,
        monotonic: Callable[[], float],
    ) -> None:
        self.group = group
        self.client = client
        self.timeouts = timeouts
        self._monotonic = monotonic
        self.generation = 0
        self._failing_since: dict[int, float] = {}
        self._views: dict[int, MemberView] = {
            i + 1: MemberView(i + 1, a, False, None, 0.0, "not asked yet") for i, a in enumerate(group.members)
        }
        self._task: asyncio.Task[None] | None = None
        self.polls = 0

    def now(self) -> float:
        return self._monotonic()

    def views(self) -> tuple[MemberView, ...]:
        return tuple(self._views[n] for n in sorted(self._views))

    def addresses(self) -> dict[int, str]:
        return {i + 1: a for i, a in enumerate(self.group.members)}

    async def refresh(self) -> None:
        """Ask every member for its report once; record who answered and for how long who did not."""
        gen = self.generation
        answers = await self.client.ask_all("GET", "/group/report", timeout=self.timeouts.report_s)
        if gen != self.generation:  # a group stop or launch happened meanwhile: these describe old servers
            return
        now = self._monotonic()
        for a in answers:
            self._views[a.node] = self._view(a, now)
        self.polls += 1

    def _view(self, a: Answer, now: float) -> MemberView:
        old = self._views.get(a.node)
        if a.ok:
            try:
                report = from_wire(a.body)
                if report.node != a.node:  # a report speaks only for the node whose key signed it
                    raise ValueError(f"a report for node {report.node} signed by node {a.node}")
            except ValueError as err:
                a = Answer(a.node, a.address, False, a.status, error=str(err))
            else:
                self._failing_since.pop(a.node, None)
                return MemberView(a.node, a.address, True, report, 0.0, "")
        since = self._failing_since.setdefault(a.node, now)
        return MemberView(a.node, a.address, False, old.report if old else None, now - since, a.error)

    def forget_reports(self) -> None:
        """After a group stop or launch: what members said before describes servers that are gone."""
        self.generation += 1
        self._views = {
            n: MemberView(n, v.address, v.reachable, None, v.unreachable_s, v.error) for n, v in self._views.items()
        }

    def forget_report(self, node: int) -> None:
        """One member relaunched: what it said before describes its old server. A poll under way
        is dropped too (`generation`): its answer may have been taken before the stop."""
        self.generation += 1
        v = self._views.get(node)
        if v is not None:
            self._views[node] = MemberView(node, v.address, v.reachable, None, v.unreachable_s, v.error)

    async def relaunch_one(self, node: int, rung: str) -> tuple[Answer, Answer | None]:
        """Stop and verify one member's server, then launch it on `rung` (a node on another rung)."""
        stop = await self.client.ask(
            node, "POST", "/group/stop", timeout=self.timeouts.stop_s, body={"timeout_s": self.timeouts.stop_s}
        )
        self.forget_report(node)
        if not stop.ok:
            return stop, None
        launch = await self.client.ask(
            node, "POST", "/group/launch", timeout=self.timeouts.launch_s, body={"rung": rung}
        )
        self.forget_report(node)
        return stop, launch

    def start(self, interval: Callable[[], float], sleep: Callable[[float], Awaitable[None]]) -> None:
        async def loop() -> None:
            while True:
                try:
                    await self.refresh()
                except Exception:  # the poller outlives any one bad answer
                    log.exception("group_poll_failed")
                await sleep(interval())

        self._task = asyncio.ensure_future(loop())

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        await self.client.close()

    def _gone(self, node: int) -> bool:
        v = self._views.get(node)
        return v is not None and not v.reachable and v.unreachable_s >= self.group.unreachable_s

    async def _ask_all(self, path: str, timeout: float, body: dict[str, object]) -> tuple[Answer, ...]:
        """Every member at once; one that has not answered its reports for `unreachable_s` (partitioned,
        away) is asked with the report's timeout, not the step's: a partitioned node held the group's
        evidence and relaunch 70 s (issue 54). A stop it misses is made good when it answers again."""
        nodes = sorted(self._views)
        asks = (
            self.client.ask(n, "POST", path, timeout=self.timeouts.report_s if self._gone(n) else timeout, body=body)
            for n in nodes
        )
        return tuple(await asyncio.gather(*asks))

    async def capture_all(self, incident_id: str) -> tuple[Answer, ...]:
        return await self._ask_all("/group/capture", self.timeouts.capture_s, {"incident": incident_id})

    async def stop_all(self) -> tuple[Answer, ...]:
        self.forget_reports()  # keeps who answers: a member gone is asked briefly
        try:
            return await self._ask_all("/group/stop", self.timeouts.stop_s, {"timeout_s": self.timeouts.stop_s})
        finally:
            self.forget_reports()

    async def launch_all(self, rung: str) -> tuple[Answer, ...]:
        self.forget_reports()
        try:
            return await self.client.ask_all(
                "POST", "/group/launch", timeout=self.timeouts.launch_s, body={"rung": rung}
            )
        finally:
            self.forget_reports()
