"""The owner in a multi-node group: `GroupSupervisor` is `owner.Supervisor` plus its part in the group
(docs/MULTINODE.md). Without `[group]` every method here is the plain owner's.

A worker holds its own incident (`hung`, for the leader) instead of acting on it, is not scraped
for token counters (its /metrics is SGLang's dummy health server's), and captures a bundle under
the leader's id when asked. The leader polls its members beside the loop, acts on the group's
verdict, and does every incident's capture, stop and launch with all its members at once. The
decisions are `supervisor.policy.group` (pure) and the member calls `supervisor.daemon.grouping`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from probes.types import Observation
from supervisor.config.settings import ConfigError, Settings, load_settings
from supervisor.daemon import grouping
from supervisor.daemon.owner import Supervisor
from supervisor.diagnostics import BundleResult
from supervisor.group.runtime import GroupRuntime
from supervisor.group.view import group_view
from supervisor.policy.group import NodeReport
from supervisor.policy.ladder import Incident
from supervisor.policy.lifecycle import State
from supervisor.policy.watchdog import Verdict
from supervisor.status.causes import HUNG_CAUSES, Cause
from supervisor.status.commands import Command, CommandResult, finish

__all__ = ["GroupSupervisor", "Supervisor"]


class GroupSupervisor(Supervisor):
    group: GroupRuntime | None = None  # set by the composition root from [group] (grouping.make_runtime)
    _stop_members_too = False  # the next stop_server is a group stop (an incident's, or the leader's stop)

    # ---- what the owner reads and publishes -----------------------------------------------

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._as_worker()

    def reload(self, settings: Settings) -> None:
        super().reload(settings)
        self._as_worker()

    def _as_worker(self) -> None:
        """A worker node's /metrics is SGLang's dummy health server's: nothing to scrape there. And
        it never moves the ladder by itself: a promotion back up is the leader's, for the group."""
        g = self.settings.group
        if g is None or g.is_leader:
            return
        rs = self.settings.restart
        if rs.promote_after_s > 0:
            self.settings = self.settings.model_copy(update={"restart": rs.model_copy(update={"promote_after_s": 0.0})})
        self._metrics_on = tuple(False for _ in self._metrics_on)

    def publish(self) -> None:
        super().publish()
        if self.group is not None:
            self._snapshot = self._snapshot.model_copy(update={"group": group_view(self.group, self._snapshot)})

    def group_report(self) -> NodeReport:
        assert self.group is not None
        return grouping.report(self.group, self.snapshot(), self.slot.history, self.slot.obs, self.clock.wall())

    def group_doc(self, incident_id: str) -> Mapping[str, object] | None:
        return grouping.bundle_doc(self.group, incident_id)

    # ---- the loop ---------------------------------------------------------------------------

    async def run(self, *, autostart: bool = True) -> None:
        g = self.group
        if g is None or g.leader is None:
            await super().run(autostart=autostart)
            return
        g.leader.start(lambda: self.settings.watchdog.poll_interval_s, self.clock.sleep)
        self.record("group_started", node=g.node, nnodes=g.settings.nnodes, members=list(g.settings.members))
        try:
            await super().run(autostart=autostart)
        finally:
            await g.leader.close()

    async def act(self, v: Verdict, obs: Observation) -> None:
        g = self.group
        if g is None:
            await super().act(v, obs)
            return
        judged = grouping.judge(g, v, self.lifecycle.state.value, self.record)
        if judged.hold:
            self.move(State.HUNG, judged.hold)
        elif judged.verdict is not None:
            await super().act(judged.verdict, obs)

    # ---- an incident, for the whole group -----------------------------------------------------

    async def incident(
        self,
        cause: Cause,
        verdict: Verdict | None,
        obs: Observation | None,
        *,
        forced_rung: int | None = None,
        diagnose: bool = True,
        incident_id: str | None = None,
    ) -> None:
        g = self.group
        if g is not None and g.leader is not None and diagnose:
            alive = obs is not None and obs.tree.root_alive and bool(obs.tree.processes)
            if not (alive and cause in HUNG_CAUSES | {"manual", "spec_regression"}):  # no capture of its own
                incident_id = incident_id or self.unique_incident_id(cause)
                g.captured = incident_id
                await grouping.capture_members(g, incident_id, self.beating, self.record)
        await super().incident(cause, verdict, obs, forced_rung=forced_rung, diagnose=diagnose, incident_id=incident_id)

    async def capture_bundle(
        self,
        incident_id: str,
        trigger: str,
        cause: str | None,
        obs: Observation,
        verdict: Verdict | None,
        *,
        native: bool | None = None,
        gdb: bool | None = None,
    ) -> BundleResult | None:
        own = super().capture_bundle(incident_id, trigger, cause, obs, verdict, native=native, gdb=gdb)
        g, open_incident = self.group, self.inhand.open_incident
        if g is None or g.leader is None or open_incident is None or open_incident.id != incident_id:
            return await own
        g.captured = incident_id  # every member's bundle at the same moment as this one
        return await grouping.together(own, grouping.capture_members(g, incident_id, self.beating, self.record))

    async def recover(self, incident: Incident, *, forced_rung: int | None, manual: bool) -> None:
        g = self.group
        if g is not None and grouping.exit_for_lws(g, self.record):  # LWS recreates the group
            self.shutdown_requested = True
            self.persist()
            return
        self._stop_members_too = g is not None and g.leader is not None
        try:
            await super().recover(incident, forced_rung=forced_rung, manual=manual)
        finally:
            self._stop_members_too = False

    async def stop_server(self, why: str) -> bool:
        g = self.group
        if g is None or g.leader is None or not self._stop_members_too:
            return await super().stop_server(why)
        self._stop_members_too = False
        return await grouping.together(super().stop_server(why), grouping.stop_members(g, self.beating, self.record))

    async def launch(self, rung_index: int, *, after_incident: bool) -> None:
        g = self.group
        if g is not None and g.leader is not None:  # the members it stopped launch the same rung
            await grouping.launch_members(g, self.settings.ladder[rung_index].name, self.beating, self.record)
        await super().launch(rung_index, after_incident=after_incident)

    # ---- commands -----------------------------------------------------------------------------

    async def handle_stop(self, cmd: Command) -> None:
        """A stop on the leader stops the group; its next launch launches every node again."""
        g = self.group
        self._stop_members_too = g is not None and g.leader is not None and cmd.source != "group"
        try:
            await super().handle_stop(cmd)
        finally:
            self._stop_members_too = False

    async def handle_reload(self, cmd: Command) -> None:
        """A reload cannot re-form a group (its members, its rank, its poller): refused, named."""
        if self.config_path is not None:
            try:
                new = await asyncio.to_thread(load_settings, self.config_path)
            except ConfigError:
                new = None  # the owner's reload reports it
            if new is not None and new.group != self.settings.group:
                why = "[group] changed: a reload cannot re-form the group; restart the daemon (systemctl restart)"
                self.record("config_reload_refused", "error", error=why)
                finish(cmd, CommandResult("invalid", why, self.lifecycle.state.value))
                return
        await super().handle_reload(cmd)

    async def handle_diagnose(self, cmd: Command) -> None:
        """The leader's `POST /group/capture`: a bundle under its incident id, as for a hang (the group
        is hung, if not this node), even with no process left (the log and the GPUs still tell)."""
        g = self.group
        if g is None or cmd.source != "group" or cmd.incident_id is None:
            await super().handle_diagnose(cmd)
            return
        obs = self.slot.obs if self.slot.obs is not None else await self.observe()
        g.captured = cmd.incident_id
        result = await self.capture_bundle(cmd.incident_id, "hung", g.held_cause, obs, None)
        st = self.lifecycle.state.value
        if result is None:
            finish(cmd, CommandResult("failed", "capture failed", st))
            return
        bundle = result.id if result.path is not None else None
        finish(
            cmd, CommandResult("done", result.error or "captured", st, bundle_id=bundle, summary=dict(result.summary))
        )
