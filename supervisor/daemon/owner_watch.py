"""The owner's watch over a running server, one step of the tick each: drain the Xid watcher, reap
orphans, tend the log keeper, observe, let the pure watchdog (`supervisor.policy.watchdog.assess`)
judge, and act on the verdict (ready, degraded, stable, promotion, or an incident).

`ServerWatch` is the third part of the one owner, `supervisor.daemon.owner.Supervisor`.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace

from probes.types import Observation
from supervisor.daemon import xids
from supervisor.daemon.owner_lifecycle import ServerLifecycle
from supervisor.policy.ladder import record_ready, record_stable
from supervisor.policy.lifecycle import SERVING, State
from supervisor.policy.watchdog import Mode, Verdict, assess, new_history


class ServerWatch(ServerLifecycle):
    def take_xids(self) -> None:
        for note in xids.take(self.xids, self.slot.obs, self.observer.gpu.scope):
            if note.xid is not None:
                self.metrics.xid(note.xid.gpu, note.xid.uuid, note.xid.xid, str(note.fields["action"]))
            self.record(note.event, note.level, **note.fields)

    async def reap_orphans(self) -> None:
        """Orphans of the tree re-parented to the daemon (a subreaper) are reaped once they exit."""
        await asyncio.to_thread(self.control.reap, self.server_pid())

    async def tend_keeper(self) -> None:
        """The server's log keeper, every poll: a dead one is replaced on the same pipe (no server
        restart, no line lost), a stopped one is named; each change is journalled once."""
        slot = self.slot
        if slot.child is None:
            slot.keeper = None
            return
        before = slot.keeper
        now = await asyncio.to_thread(self.control.tend_keeper, slot.child.pid, self.log_files())
        slot.keeper = now
        fields = {"pid": now.pid, "old_pid": now.old_pid, "why": now.why, "pipe_bytes": now.pipe_bytes}
        if now.condition == "replaced":
            self.counters.keepers_replaced += 1
            self.metrics.keeper_replaced()
            self.record("log_keeper_replaced", "warning", **fields)
        elif now.condition == (before.condition if before is not None else None):
            return
        elif now.condition == "stopped":
            self.record("log_keeper_stopped", "error", **fields)
        elif now.condition == "lost":
            self.record("log_keeper_lost", "error", **fields)

    async def watch(self) -> None:
        """Observe the running server, let the watchdog judge it, act on the verdict."""
        obs = await self.observe()
        slot = self.slot
        if slot.child is not None and obs.tree.root_exit is None and not obs.tree.root_alive:
            # waitpid says the main process lives but /proc did not show it (EMFILE, EACCES, a race):
            # this poll saw nothing trustworthy, which is not "the server exited".
            self.counters.unknown_observations += 1
            self.log.warning("observation_unknown", count=self.counters.unknown_observations)
            self.publish()
            return
        if slot.history is None:
            slot.history = new_history(self.clock.monotonic())
        mode: Mode = "serving" if self.lifecycle.state in SERVING else "starting"
        spec = self.speculative()[self.ladder.current]
        verdict, slot.history = assess(slot.history, obs, obs.at, self.settings.watchdog, mode=mode, speculative=spec)
        await self.act(verdict, obs)
        self.save_log_position()
        self.publish()

    async def act(self, v: Verdict, obs: Observation) -> None:
        if v.is_incident:
            assert v.cause is not None
            await self.incident(v.cause, v, obs)
        elif self.lifecycle.state == State.STARTING:
            if v.status == "ready":
                self.mark_ready()
            else:
                self.reason = v.reason
        else:
            await self.act_serving(v, self.clock.monotonic())

    def mark_ready(self) -> None:
        slot, now, rung = self.slot, self.clock.monotonic(), self.current_rung_name()
        slot.ready_at = now
        slot.stable_marked = False
        self.ladder = record_ready(self.ladder)
        if slot.adopted:  # a takeover is not a load: the launch-to-ready time is the record's
            slot.takeover_s = round(now - slot.launched_at, 3)
            slot.time_to_ready_s = slot.record.time_to_ready_s if slot.record is not None else None
            self.persist()
            self.metrics.takeover(slot.takeover_s)
            self.journal.append("server_ready", rung=rung, adopted=True, takeover_s=slot.takeover_s)
            self.move(State.READY, f"adopted server ready on rung {rung}")
            return
        slot.time_to_ready_s = round(now - slot.launched_at, 3)
        if slot.record is not None:
            slot.record = replace(slot.record, time_to_ready_s=slot.time_to_ready_s)
        self.persist()
        self.metrics.ready(slot.time_to_ready_s)
        self.journal.append("server_ready", rung=rung, time_to_ready_s=slot.time_to_ready_s)
        self.move(State.READY, f"ready on rung {rung} in {slot.time_to_ready_s:.1f} s")

    async def act_serving(self, v: Verdict, now: float) -> None:
        st, slot = self.lifecycle.state, self.slot
        if v.cause == "spec_regression":
            if self.settings.watchdog.on_spec_regression == "fallback":
                await self.incident("spec_regression", v, slot.obs)
                return
            if not slot.spec_alerted:
                slot.spec_alerted = True
                self.counters.incidents += 1
                self.metrics.incident("spec_regression", "none")
                self.journal.append("spec_regression", reason=v.reason, rung=self.current_rung_name())
        if v.status == "degraded" and st == State.READY:
            self.move(State.DEGRADED, v.reason)
        elif v.status == "ready" and st == State.DEGRADED:
            slot.spec_alerted = False
            self.move(State.READY, "recovered")
        elif v.status == "degraded":
            self.reason = v.reason
        rs = self.settings.restart
        if slot.ready_at is not None and not slot.stable_marked and now - slot.ready_at >= rs.stable_s:
            slot.stable_marked = True
            self.ladder = record_stable(self.ladder)
            self.persist()
            self.journal.append("server_stable", rung=self.current_rung_name())
        if (
            rs.promote_after_s > 0
            and self.ladder.current > 0
            and slot.ready_at is not None
            and now - slot.ready_at >= rs.promote_after_s
            and self.lifecycle.state == State.READY
        ):
            top = self.settings.ladder[0].name
            self.journal.append("promotion", from_rung=self.current_rung_name(), to_rung=top)
            await self.manual_restart(0, "promotion", diagnose=False, incident_id=self.unique_incident_id("manual"))
