"""One launch of the server: what uvicorn's `Process` is to its supervisor.

A `Server` is made for each launch (`spawn`) or adoption (`adopt`) and holds what belongs to that
one tree: its main process, the record a successor adopts it by, its log keeper and captured output,
and what the watchdog has seen of it. It spawns or adopts, feeds the observer its new log lines,
tends its log keeper, stops and verifies, and hands over; the owner (`supervisor.daemon.owner.Owner`)
holds the current one, asks it, and records what it reports. It never records, moves a state or
touches the ladder: each act returns its outcome.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from probes.types import LogLine, Observation
from supervisor.clock import Clock
from supervisor.config.settings import RestartSettings, Settings, WatchdogSettings
from supervisor.daemon import stopping
from supervisor.daemon.adopt import ServerRecord, refusal, starttime_of
from supervisor.daemon.observe import Observer, Target
from supervisor.daemon.stopping import StopTools
from supervisor.diagnostics.flightrec import launch_env as fr_launch_env
from supervisor.host.inherit import ENV_KEYS as INHERIT_KEYS
from supervisor.logs.reader import LogCapture
from supervisor.logs.tending import KeeperStatus
from supervisor.policy.gpuwait import wants_look
from supervisor.policy.rasrule import fold_ras
from supervisor.policy.recovery import ServingStep, serving_step
from supervisor.policy.watchdog import History, Mode, Verdict, assess, new_history, ras_incident
from supervisor.process.control import Child, LogFiles, ProcessControl, SpawnError, port_holder
from supervisor.process.leftovers import kept_on_port
from supervisor.status.eventnames import EventName
from supervisor.status.snapshot import LogKeeperView

# ---- launching: is the port free, then spawn the rung's command with its output captured ----

@dataclass(frozen=True)
class Spawned:
    """The server runs: its process, its captured output, and the record a successor adopts it by
    (None when its start time could not be read: it then cannot be adopted)."""

    child: Child
    capture: LogCapture
    record: ServerRecord | None


@dataclass(frozen=True)
class SpawnFailed:
    """The command could not be executed at all (missing program, permission denied)."""

    error: str


async def port_holder_of(host: str, port: int) -> str | None:
    """Who holds the server's port (a launch onto it would only exit at once), or None when free;
    a tree another live daemon (or no findable daemon) launched there is named as such."""
    return await asyncio.to_thread(_port_holder_named, host, port)


def _port_holder_named(host: str, port: int) -> str | None:
    holder = port_holder(host, port)
    if holder is None:
        return None
    kept = kept_on_port(port)
    return holder if kept is None else f"{holder}: {kept}; it is not this daemon's to stop"


@dataclass(frozen=True)
class SpawnRequest:
    argv: Sequence[str]
    env: Mapping[str, str]
    marker: str
    cwd: str | None
    files: LogFiles
    memory_lines: int
    rung: str
    launched_wall: float


async def spawn_tree(control: ProcessControl, req: SpawnRequest, clock: Clock) -> Spawned | SpawnFailed:
    """Spawn the rung's command; its lines are captured from the log's current end (the keeper
    appends after it), so a new launch never shows the previous server's lines."""
    files = req.files
    capture = LogCapture(
        files.dir,
        memory_lines=req.memory_lines,
        start=LogCapture.end_of(files.dir, files.name),
        monotonic=clock.monotonic,
    )
    try:
        child = await asyncio.to_thread(control.spawn, req.argv, req.env, req.marker, req.cwd, files)
    except SpawnError as err:
        return SpawnFailed(str(err))
    capture.start()
    starttime = starttime_of(child.pid)
    record = (
        None if starttime is None else ServerRecord(child.pid, starttime, req.rung, req.launched_wall, capture.position)
    )
    return Spawned(child, capture, record)


# ---- adoption: a predecessor's tree, when supervisor.daemon.adopt.refusal proves it that server ----

@dataclass(frozen=True)
class Adopted:
    child: Child
    capture: LogCapture


@dataclass(frozen=True)
class NotAdopted:
    why: str


async def take_over(
    record: ServerRecord,
    rung: int | None,
    marker: str,
    control: ProcessControl,
    files: LogFiles,
    memory_lines: int,
    clock: Clock,
) -> Adopted | NotAdopted:
    """`rung`: the record's rung in today's ladder (None: no longer there, so not adopted)."""
    why = await asyncio.to_thread(refusal, record, marker)
    if why is None and rung is None:
        why = f"its rung {record.rung!r} is no longer in the ladder"
    if why is not None:
        return NotAdopted(why)
    # Its output is read from where the predecessor stopped reading (duplicates, never losses).
    capture = LogCapture(files.dir, memory_lines=memory_lines, start=record.log, monotonic=clock.monotonic).start()
    child = await asyncio.to_thread(control.adopt, record.pid, record.starttime, marker)
    return Adopted(child, capture)


# A monotonic total fed by a reading that may start again at 0 (a counter in a file that each new
# writer recreates): what /status shows and what the Prometheus counter is fed from, one source.
@dataclass
class RestartingCount:
    total: int = 0
    seen: int = 0  # the reading at the last call

    def feed(self, reading: int) -> int:
        """The total after `reading`: growth counts; a drop is a fresh counter, all of it new."""
        self.total += reading - self.seen if reading >= self.seen else reading
        self.seen = reading
        return self.total




@dataclass(frozen=True)
class Ready:
    """What reaching ready was for this launch: a load's time to ready, or an adoption's takeover."""

    adopted: bool
    time_to_ready_s: float | None
    takeover_s: float | None = None


@dataclass
class Server:
    """The current server: its process, what a successor needs to adopt it, its output, and what
    the watchdog has seen of it. A launch or an adoption makes a fresh one; a stop empties it (what
    it showed stays for /status until the next one). Only its own methods write its fields: the
    owner asks it (`judge`, `became_ready`, `serving_step`, `stop`) and records what it answers."""

    launched_at: float
    launched_wall: float | None = None
    child: Child | None = None
    record: ServerRecord | None = None  # what a successor needs to adopt `child`
    capture: LogCapture | None = None
    keeper: KeeperStatus | None = None  # the log keeper at the last poll (supervisor.logs.tending)
    log_seq: int = 0
    history: History | None = None
    obs: Observation | None = None
    ready_at: float | None = None
    time_to_ready_s: float | None = None
    adopted: bool = False  # taken over from an earlier daemon
    takeover_s: float | None = None  # adoption to ready, for an adopted server
    stable_marked: bool = False
    spec_alerted: bool = False
    keeper_errors: RestartingCount = field(default_factory=RestartingCount)  # survives each launch's keeper

    @classmethod
    def fresh(cls, now: float, launched_wall: float, before: Server | None = None) -> Server:
        """A new server (launched or adopted): nothing the previous one showed carries over but the
        running count of the log keepers' write errors (each keeper starts its stats file at 0)."""
        errors = before.keeper_errors if before is not None else RestartingCount()
        return cls(launched_at=now, launched_wall=launched_wall, history=new_history(now), keeper_errors=errors)

    @property
    def pid(self) -> int | None:
        return self.child.pid if self.child is not None else None

    @property
    def running(self) -> bool:
        return self.child is not None

    # ---- spawn or adopt ---------------------------------------------------------------------

    async def spawn(self, control: ProcessControl, request: SpawnRequest, clock: Clock) -> SpawnFailed | None:
        """Start the tree; None once it runs (its record saved from here on lets a successor adopt it)."""
        spawned = await spawn_tree(control, request, clock)
        if isinstance(spawned, SpawnFailed):
            return spawned
        self.child, self.capture, self.record = spawned.child, spawned.capture, spawned.record
        return None

    async def adopt(
        self, rung: int | None, marker: str, control: ProcessControl, files: LogFiles, lines: int, clock: Clock
    ) -> NotAdopted | None:
        """Hold the tree a predecessor left running when `take_over` proves it ours (its record,
        restored at start, names it); why not otherwise (the record is then forgotten)."""
        record = self.record
        assert record is not None
        taken = await take_over(record, rung, marker, control, files, lines, clock)
        if isinstance(taken, NotAdopted):
            self.record = None
            return taken
        self.adopted = True
        self.capture, self.child = taken.capture, taken.child
        return None

    def restore(self, record: ServerRecord | None) -> None:
        """At the daemon's start: the record its predecessor saved, to adopt the tree by."""
        self.record = record

    def forget(self) -> ServerRecord | None:
        """The saved record is not taken over (the caller stops whatever carries the marker)."""
        record, self.record = self.record, None
        return record

    # ---- observe ----------------------------------------------------------------------------

    def new_lines(self) -> list[LogLine]:
        """The log lines captured since the last call."""
        if self.capture is None:
            return []
        lines = self.capture.lines_since(self.log_seq)
        if lines:
            self.log_seq = lines[-1].seq
        return lines

    def target(self, *, marker: str, serving: bool, metrics: bool, look: bool) -> Target:
        child = self.child
        return Target(
            root_pid=child.pid if child is not None else None,
            root_exit=child.poll() if child is not None else None,
            marker=marker,
            serving=serving,
            metrics=metrics,
            look=look,
        )

    async def observe(
        self,
        observer: Observer,
        *,
        marker: str,
        serving: bool,
        metrics: bool,
        look: WatchdogSettings | None,
        now: float,
    ) -> tuple[Observation, list[LogLine]]:
        """One poll of this tree: its new log lines fed to the observer, then every channel read.
        `look`: while starting, the window in force (a py-spy look once CPU alone moved half of it)."""
        lines = self.new_lines()
        if lines:
            observer.feed(lines)
        wants = look is not None and self.wants_look(now, look)
        self.obs = await observer.observe(self.target(marker=marker, serving=serving, metrics=metrics, look=wants))
        return self.obs, lines

    def wants_look(self, now: float, wd: WatchdogSettings) -> bool:
        """A py-spy look at the busy threads while starting, once CPU alone moved half of `wd`'s
        window: the window in force, the same one the verdict is judged by (`judge`)."""
        h = self.history
        if h is None or h.ready_at is not None:
            return False
        cpu_quiet = now - h.moved_at.get("cpu", h.launched_at)
        return wants_look(now - h.last_progress_at, cpu_quiet, wd)

    def unseen(self, obs: Observation) -> bool:
        """waitpid says the main process lives but /proc did not show it (EMFILE, EACCES, a race):
        this poll saw nothing trustworthy, which is not "the server exited"."""
        return self.child is not None and obs.tree.root_exit is None and not obs.tree.root_alive

    # ---- judge --------------------------------------------------------------------------------

    def judge(
        self, obs: Observation, wd: WatchdogSettings, *, mode: Mode, speculative: bool, now: float
    ) -> Verdict:
        """The watchdog's verdict on this poll (`wd`: the window in force), with NCCL RAS's reports
        folded in (policy/rasrule.py): its finding stands where the watchdog found none."""
        history = self.history if self.history is not None else new_history(now)
        verdict, history = assess(history, obs, obs.at, wd, mode=mode, speculative=speculative)
        ras, found = fold_ras(history.ras, obs.ras, obs.tree.pids, obs.at, wd.ras_confirm_s)
        self.history = replace(history, ras=ras)
        if found is None or verdict.is_incident:
            return verdict
        return ras_incident(found, mode, obs.logs.phase)

    # ---- ready and serving ----------------------------------------------------------------------

    def became_ready(self, now: float) -> Ready:
        """Ready: a load's time to ready (kept in the record a successor adopts), or an adoption's
        takeover time (the load's time stays the record's)."""
        self.ready_at = now
        self.stable_marked = False
        if self.adopted:  # a takeover is not a load: the launch-to-ready time is the record's
            self.takeover_s = round(now - self.launched_at, 3)
            self.time_to_ready_s = self.record.time_to_ready_s if self.record is not None else None
            return Ready(True, self.time_to_ready_s, self.takeover_s)
        self.time_to_ready_s = round(now - self.launched_at, 3)
        if self.record is not None:
            self.record = replace(self.record, time_to_ready_s=self.time_to_ready_s)
        return Ready(False, self.time_to_ready_s)

    def serving_step(self, s: RestartSettings, *, now: float, rung: int, ready: bool) -> ServingStep:
        """The serving poll's steps beside the verdict (policy/recovery.py); stable is marked here, once."""
        marked = self.stable_marked
        step = serving_step(s, now=now, ready_at=self.ready_at, stable_marked=marked, rung=rung, ready=ready)
        if step.stable:
            self.stable_marked = True
        return step

    def first_spec_alert(self) -> bool:
        """A speculative regression alerted once per launch (until it recovers)."""
        first, self.spec_alerted = not self.spec_alerted, True
        return first

    def spec_recovered(self) -> None:
        self.spec_alerted = False

    # ---- output -------------------------------------------------------------------------------

    def log_tail(self, n: int) -> list[str]:
        return self.capture.tail(n) if self.capture is not None else []

    def log_write_errors(self) -> int:
        """The log keepers' write errors so far, across this daemon's launches (each keeper starts
        its stats file at 0; a stopped server's last count stays)."""
        reading = self.capture.stats.write_errors if self.capture is not None else None
        return self.keeper_errors.feed(reading if reading is not None else self.keeper_errors.seen)

    def keeper_view(self, replaced: int) -> LogKeeperView | None:
        k = self.keeper
        if k is None or self.child is None:
            return None
        return LogKeeperView(
            pid=k.pid, condition=k.condition, replaced=replaced, pipe_bytes=k.pipe_bytes, pipe_size=k.pipe_size
        )

    def saved_record(self) -> ServerRecord | None:
        """The record to persist, with the log position a successor resumes from."""
        if self.record is not None and self.capture is not None:
            self.record = replace(self.record, log=self.capture.position or self.record.log)
        return self.record

    def log_moved(self) -> bool:
        """The captured log moved past the position last saved."""
        record, cap = self.record, self.capture
        return record is not None and cap is not None and cap.position is not None and cap.position != record.log

    # ---- the log keeper ---------------------------------------------------------------------

    async def tend_keeper(self, control: ProcessControl, files: LogFiles) -> KeeperStatus | None:
        """A dead keeper is replaced on the same pipe (no server restart, no line lost); the keeper
        now, when that is news (a replacement, or a change of condition), else None."""
        if self.child is None:
            self.keeper = None
            return None
        before = self.keeper
        now = await asyncio.to_thread(control.tend_keeper, self.child.pid, files)
        self.keeper = now
        if now.condition != "replaced" and now.condition == (before.condition if before is not None else None):
            return None
        return now

    @staticmethod
    def keeper_news(now: KeeperStatus) -> tuple[EventName, str, dict[str, object]]:
        """The journal line for a change of the keeper: replaced (a warning), stopped or lost (errors)."""
        fields: dict[str, object] = {"pid": now.pid, "old_pid": now.old_pid, "why": now.why}
        fields["pipe_bytes"] = now.pipe_bytes
        if now.condition == "replaced":
            return "log_keeper_replaced", "warning", fields
        return ("log_keeper_stopped" if now.condition == "stopped" else "log_keeper_lost"), "error", fields

    def describe_keeper(self) -> str:
        return self.keeper.describe() if self.keeper is not None else ""

    # ---- stop and hand over -----------------------------------------------------------------

    async def stop(self, tools: StopTools, marker: str, why: str) -> stopping.Stopped:
        """Stop the tree and verify the port and GPU memory are free; then no tree from here on
        (what it showed stays for /status; its keeper's last error count is kept)."""
        seen = self.obs.tree.pids if self.obs is not None else ()
        stopped = await stopping.stop_tree(tools, self.child, marker, tuple(seen), why)
        await self.close_log()
        self.log_write_errors()  # its last count, before the next keeper starts its file afresh
        self.capture, self.child, self.record, self.history = None, None, None, None
        return stopped

    async def close_log(self) -> None:
        """Stop reading its output (a stop, or a handover: the position then covers every line read)."""
        if self.capture is not None:
            await asyncio.to_thread(self.capture.close)


# ---- what the server gets -------------------------------------------------------------------

# The daemon's own systemd plumbing never reaches the server, nor what a handoff passed it
# (`run` takes those out of its environment first; this is the second fence).
_NOT_FOR_CHILD = frozenset(
    {"NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "LISTEN_FDS", "LISTEN_PID", "INVOCATION_ID", *INHERIT_KEYS}
)


def log_files(settings: Settings) -> LogFiles:
    """Where the log keeper writes the server's output, and how much it keeps."""
    logs = settings.logs
    return LogFiles(
        settings.state_dir / "logs",
        int(logs.max_file_mb * 1024 * 1024),
        logs.backups,
        journal_socket=logs.journal_socket if logs.journal else None,
        journal_id=logs.journal_identifier,
    )


def child_env(settings: Settings, env: Mapping[str, str], extra: Mapping[str, str]) -> dict[str, str]:
    """The server's environment: the daemon's, less its own plumbing and its API token, plus the
    rung's, plus the Flight Recorder's where it is on."""
    out = {k: v for k, v in env.items() if k not in _NOT_FOR_CHILD}
    out.pop(settings.api.token_env, None)
    out.update(extra)
    d = settings.diagnostics
    fr_dir = Path(settings.paths.state_dir) / "flightrec" if d.flight_recorder else None
    out.update(fr_launch_env(out, fr_dir, d.flight_recorder_entries))
    return out
