"""Back to serving fast (issue 36), as one helper the owner holds and calls at named points: a
launch (`launching`: the kernel caches' environment, the timeline starts, the outage's backoff
ends), the server's lines (`lines`), each poll while starting (`window`: the learned stall window
in force, and the quiet time the timeline learns from), ready (`ready`: the timeline is journalled
and compared, the book learns, the caches' marker is cleared, the outage ends), an incident
(`incident`, `evidence_done`, `stopped`: the outage's parts; the weights' residency is measured and
read ahead in a thread meanwhile), and publishing (`publish`: `/status` fields).

It records through the `record` it is given (the owner's one way to write an event) and never moves
a state, stops a process or touches the ladder. What fails here (a full disk, an unreadable book) is
recorded and survived: the launch goes on with the configured window and unpinned caches.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, get_args

from probes.types import LogLine, Observation, Phase
from supervisor.clock import iso
from supervisor.config.settings import Settings, WatchdogSettings
from supervisor.engines import profile_of
from supervisor.engines.profile import LogGrammar
from supervisor.policy.learned import LaunchKey, Window, fingerprint, fold_quiet, learn, model_of, window_for
from supervisor.policy.watchdog import History, Verdict
from supervisor.status.launchviews import CacheView, LaunchTimelineView, OutageView, ResidencyView, StallWindowView
from supervisor.status.snapshot import StatusSnapshot
from supervisor.warmstart import cacheplace, kernelcache, residency
from supervisor.warmstart.timeline import (
    BookEntry,
    GoodLaunch,
    LaunchBook,
    Milestones,
    OutageClock,
    compare,
    views,
)

Record = Callable[..., None]  # the owner's `record(event, level, /, *, only=None, **fields)`
BOOK = "launches.json"
# The verdict's figure that says how long the server had shown nothing before it was judged.
# A stopped process's stop is its onset (policy/stopped.py); an unhealthy one's, the first failed check.
_QUIET_FIGURES = ("since_progress_s", "since_tokens_s", "tokens_quiet_s", "stopped_s", "since_first_failure_s")


def host_name() -> str:
    return socket.gethostname() or "localhost"


def key_for(argv: Sequence[str], rung: str, host: str) -> LaunchKey:
    return LaunchKey(host, model_of(argv), rung, fingerprint(argv))


# The watchdog phase each milestone begins: a phase a good start passed between two polls was quiet
# for less than a poll, and is learned as such (its window is then the floor).
_PHASE_OF = {
    "spawn": "spawning",
    "weights_loading": "loading_weights",
    "kv_allocated": "allocating_kv",
    "graph_capture": "capturing_graphs",
    "warmup": "warming_up",
}


# Every start-up phase, in SGLang's order (probes/types.py). A start that reached ready went through
# each its rung has, seen at a poll or not; one its rung lacks (no draft model) never needs a window.
_START_PHASES = tuple(p for p in get_args(Phase) if p != "serving")


def passed(launch: _Launch) -> dict[str, float]:
    """The longest quiet interval of every phase the launch went through (0 for one never polled in:
    it was passed between two polls, as `loading_draft` of a small draft model always is)."""
    out = {p: 0.0 for p in _START_PHASES}
    out.update({p: 0.0 for p in launch.phases if p != "serving"})
    out.update({_PHASE_OF[m]: 0.0 for m in launch.milestones.seen if m in _PHASE_OF})
    out.update(launch.longest)
    return out


def detection_of(verdict: Verdict | None) -> float:
    """How long the server had been quiet when judged (0 for an exit or a request: no window)."""
    if verdict is None:
        return 0.0
    figures = dict(verdict.figures)
    for name in _QUIET_FIGURES:
        if name in figures:
            return max(0.0, float(figures[name]))
    return 0.0


@dataclass
class _Launch:
    key: LaunchKey
    started_wall: float
    milestones: Milestones
    longest: dict[str, float]
    cache: CacheView | None = None
    residency: ResidencyView | None = None
    time_to_ready_s: float | None = None
    adopted: bool = False
    before: GoodLaunch | None = None  # the last good launch of the key when this one began
    after_fault: bool = False  # the first launch after an incident that named a GPU fault (Xid)
    phases: set[str] = field(default_factory=set)  # the watchdog phases polls saw it in


class WarmStart:
    def __init__(
        self,
        settings: Settings,
        record: Record,
        *,
        host: str | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.monotonic = monotonic
        self.settings = settings
        self.record = record
        self.host = host or host_name()
        self.book = LaunchBook(settings.state_dir / BOOK).load()
        if self.book.load_error:
            record("launch_book_unreadable", "warning", error=self.book.load_error)
        self.current: _Launch | None = None
        self.window_now: Window | None = None
        self.outage: OutageClock | None = None
        self.last_outage: OutageView | None = None
        self.residency: ResidencyView | None = None  # measured for the next launch
        self.verdict_at: float | None = None  # monotonic time of the last incident's verdict
        self.fault_pending = False  # an incident named a GPU fault: the next launch is not a learned start
        self.tasks: set[asyncio.Task[None]] = set()
        self.caches = kernelcache.Home(
            settings.cache_dir, settings.state_dir, adopt_legacy=settings.paths.cache_dir is None
        )
        if settings.caches.pin:
            self._check_cache_dir()

    def _check_cache_dir(self) -> None:
        """At start (creating nothing): a `cache_dir` another user could steer is refused (the launches
        go on unpinned), a shared sticky one gets this daemon's private sub-directory (issue 50)."""
        place, why = cacheplace.inspect(self.caches.cache_dir, self.caches.euid)
        if place != "own":
            self.record("kernel_cache", "warning", state="unpinned" if place == "refused" else "private", reason=why)

    # ---- a launch ----------------------------------------------------------------------------

    def _grammar(self, rung: str) -> LogGrammar:
        """The lines of the engine `rung` runs (a ladder may cross engines)."""
        i = self.settings.rung_index(rung)
        ladder = self.settings.ladder
        return profile_of(self.settings.engine_of(ladder[i] if i is not None else ladder[0])).log

    async def launching(
        self, argv: Sequence[str], rung: str, server_env: Mapping[str, str], now: float, wall: float
    ) -> dict[str, str]:
        """A launch of `argv` on `rung` is about to be spawned: the variables the server's environment
        gets (the kernel caches the operator left unset), one call from the owner's launch. The caches'
        set-aside and prune walk directories: in a thread, so /status answers meanwhile."""
        key = key_for(argv, rung, self.host)
        entry = self.book.get(key)
        before = entry.last_good if entry is not None else None
        launch = _Launch(
            key, wall, Milestones(now, grammar=self._grammar(rung)), {}, residency=self.residency, before=before
        )
        launch.after_fault, self.fault_pending = self.fault_pending, False
        self.current, self.residency, self.window_now = launch, None, None
        if self.outage is not None:
            self.outage.close_step(now, "relaunch")
        c = self.settings.caches
        try:
            prepared = await asyncio.to_thread(
                kernelcache.prepare,
                self.caches,
                key.fingerprint,
                server_env,
                pin=c.pin,
                max_bytes=int(c.max_gb * 1024**3),
                now_wall=wall,
            )
        except OSError as err:
            self.record("kernel_cache", "error", state="unpinned", error=str(err), rung=rung)
            launch.cache = CacheView(dir="", state="unpinned")
            return {}
        launch.cache = prepared.view
        if prepared.view.refused:
            self.record("kernel_cache", "warning", state="unpinned", reason=prepared.view.refused, rung=rung)
        for what in prepared.left_alone:
            self.record("kernel_cache", "warning", state="left_alone", reason=what)
        if prepared.adopted:
            self.record("kernel_cache", state="adopted", moved=list(prepared.adopted), dir=prepared.view.dir)
        if prepared.view.set_aside:
            why = "a launch died before ready: what it wrote may be half-written and is not reused"
            self.record("kernel_cache", "warning", state="set_aside", moved_to=prepared.view.set_aside, reason=why)
        if prepared.pruned:
            self.record("kernel_cache", state="pruned", removed=list(prepared.pruned), max_gb=c.max_gb)
        return prepared.env

    def adopting(self, argv: Sequence[str], rung: str, now: float, wall: float) -> None:
        """An adopted server: no milestones of its load were seen, and it teaches nothing."""
        milestones = Milestones(now, grammar=self._grammar(rung))
        self.current = _Launch(key_for(argv, rung, self.host), wall, milestones, {}, adopted=True)
        cache = kernelcache.existing(self.caches, self.current.key.fingerprint) if self.settings.caches.pin else None
        if cache is not None:
            self.current.cache = CacheView(dir=cache, state="hit")

    def hear(self, event: str, fields: Mapping[str, object]) -> None:
        """The owner's events it follows on the bus: a server ready (the timeline, the book, the
        outage's end) and a stop by request (no outage against anyone's wish)."""
        if event == "server_ready":
            ready_s = fields.get("time_to_ready_s")
            self.ready(self.monotonic(), None if fields.get("adopted") or ready_s is None else float(str(ready_s)))
        elif event == "state_changed" and fields.get("new") == "stopped":
            self.outage = None

    def lines(self, lines: Sequence[LogLine]) -> None:
        if self.current is not None and not self.current.adopted:
            self.current.milestones.feed(lines)

    def window(self, obs: Observation, history: History, wd: WatchdogSettings) -> WatchdogSettings:
        """While starting, each poll: the quiet time so far is learned for the phase it belonged to,
        and the watchdog settings with the phase's window in force are returned."""
        launch = self.current
        if launch is None:
            return wd
        launch.longest = fold_quiet(launch.longest, history.base.phase, obs.at - history.last_progress_at)
        launch.phases.add(obs.logs.phase)
        entry = self.book.get(launch.key)
        w = window_for(entry.learned if entry else None, obs.logs.phase, wd.startup_stall_s, self.settings.learned)
        if launch.after_fault and w.window_s < wd.startup_stall_s:
            # A GPU recovering from a fault (the 119 s warm-up after an Xid on the H200) is not a start
            # this host learned from: its quiet phases may be far longer than any good start's.
            why = "the first launch after a GPU fault (Xid): the configured window, not the learned one"
            w = Window(obs.logs.phase, wd.startup_stall_s, "configured", why, w.learned_quiet_s)
        self.window_now = w
        if w.window_s == wd.startup_stall_s:
            return wd
        return wd.model_copy(update={"startup_stall_s": w.window_s})

    def in_force(self, wd: WatchdogSettings) -> WatchdogSettings:
        """The watchdog settings with the window the last verdict was judged by (`window`): the
        py-spy look waits for half of this window, never for half of a configured one the verdict
        no longer uses (issue 48: a GPU-wait hang was looked at only after 90 s)."""
        w = self.window_now
        if self.current is None or w is None or w.window_s == wd.startup_stall_s:
            return wd
        return wd.model_copy(update={"startup_stall_s": w.window_s})

    def ready(self, now: float, time_to_ready_s: float | None) -> None:
        """The server is ready: journal the timeline (compared with the last good launch), learn from
        it, clear the caches' marker, end the outage."""
        launch = self.current
        if launch is None:
            return
        launch.milestones.mark("ready", now)
        launch.time_to_ready_s = time_to_ready_s
        if launch.cache is not None:
            with contextlib.suppress(OSError):
                launch.cache = kernelcache.mark_ready(launch.cache, self.caches)
        entry = self.book.get(launch.key)
        view = self._timeline(launch)
        if not launch.adopted:
            self.record(
                "launch_timeline",
                rung=launch.key.rung,
                fingerprint=launch.key.fingerprint,
                milestones={m.name: m.at_s for m in view.milestones},
                phases={m.name: m.phase_s for m in view.milestones if m.phase_s is not None},
                time_to_ready_s=time_to_ready_s,
                longest_quiet_s=view.longest_quiet_s,
                compared=list(view.compared),
                cache=None if view.cache is None else view.cache.model_dump(),
                residency=None if view.residency is None else view.residency.model_dump(),
                after_gpu_fault=launch.after_fault,
            )
        if not launch.adopted and not launch.after_fault:  # a start after a GPU fault teaches nothing
            good = GoodLaunch(launch.milestones.offsets(), time_to_ready_s or 0.0, launch.started_wall)
            learned = learn(entry.learned if entry else None, passed(launch))
            self.book.put(BookEntry(launch.key, learned, good))
            try:
                self.book.save()
            except OSError as err:
                self.record("launch_book_unwritable", "error", only="log", error=str(err))
        self._end_outage(now, launch.key.rung)

    # ---- an incident ----------------------------------------------------------------------

    def incident(
        self, incident_id: str, cause: str, verdict: Verdict | None, now: float, *, requested: bool = False
    ) -> None:
        """A verdict: the outage begins at the fault's onset as best known (the verdict's quiet time,
        the first failed health check); before serving again, it goes on, except that a fault in the
        relaunch of an operator's restart or promote (`requested`) is an outage of its own."""
        self.verdict_at = now
        detection = detection_of(verdict)
        if self.outage is not None and self.outage.requested and not requested:
            onset = max(self.outage.mark, now - detection)
            self.outage.close_step(onset, "relaunch")
            self._record_outage(self.outage, self.current.key.rung if self.current else None, ended_by=incident_id)
            self.outage = None
        if self.outage is None:
            self.outage = OutageClock(incident_id, cause, now, detection, requested=requested)
        else:
            self.outage.again(now)
        self.window_now = None
        self._look_at_weights()

    def evidence_done(self, now: float) -> None:
        if self.outage is not None and self.outage.step == "evidence":
            self.outage.close_step(now, "stop_release")

    def stopped(self, now: float) -> None:
        if self.outage is not None:
            if self.outage.step == "evidence":  # no capture: the stop follows the verdict at once
                self.outage.close_step(now, "stop_release")
            if self.outage.step == "stop_release":
                self.outage.close_step(now, "backoff")

    def gpu_fault(self, seen_s: float) -> None:
        """The incident named a GPU fault (Xid) the daemon read `seen_s` before its verdict: the next
        launch waits the configured start-up window, and an outage that began with this verdict began
        at the fault (its detection part counts from the Xid, not from the rank's death it caused)."""
        self.fault_pending = True
        if self.outage is not None:
            self.outage.began_before(seen_s)

    def backoff_left(self, backoff_s: float, now: float) -> float:
        """What is left of the ladder's backoff, counted from the verdict rather than from the verified
        stop: the evidence and the stop already spaced this attempt from the last one, so a hang's
        relaunch does not wait a second time for what it spent capturing (issue 36). A crash loop
        (no evidence, a fast stop) still waits about the whole backoff, doubling to its cap."""
        at = self.verdict_at
        return backoff_s if at is None else max(0.0, backoff_s - max(0.0, now - at))

    def _end_outage(self, now: float, rung: str) -> None:
        o = self.outage
        if o is None:
            return
        o.close_step(now, "relaunch")
        self.outage = None
        self._record_outage(o, rung)

    def _record_outage(self, o: OutageClock, rung: str | None, *, ended_by: str | None = None) -> None:
        self.last_outage = OutageView(
            incident=o.incident, cause=o.cause, total_s=o.total_s, parts=dict(o.parts), daemon_s=o.daemon_s,
            rung=rung, ended_by=ended_by,
        )  # fmt: skip
        self.record("outage", **self.last_outage.model_dump())

    def _look_at_weights(self) -> None:
        c = self.settings.caches
        if not c.weights_residency or self.current is None:
            return
        task = asyncio.get_running_loop().create_task(self._weights(self.current.key.model, self.current))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _weights(self, model: str, hung: _Launch) -> None:
        """Measured in a thread while the evidence is captured; recorded on the loop. The relaunch
        that follows `hung` (the launch of the incident) shows it, or, when it was spawned before the
        look finished, gets it as soon as it is known."""
        c = self.settings.caches
        try:
            view = await asyncio.to_thread(_look, model, c.weights_readahead, c.max_weight_files)
        except Exception as err:  # a look at the page cache must never cost the incident
            self.record("weights_residency", "warning", model=model, error=repr(err)[:300])
            return
        if view is None:
            return
        launch = self.current
        if launch is not None and launch is not hung and launch.residency is None:
            launch.residency = view  # the relaunch was spawned before the look finished
        else:
            self.residency = view  # for the relaunch to come
        self.record("weights_residency", **view.model_dump(), model=model)

    # ---- what /status shows ------------------------------------------------------------------

    def _timeline(self, launch: _Launch) -> LaunchTimelineView:
        now_views = views(launch.milestones.offsets())
        good = launch.before
        good_views = views(good.offsets) if good is not None else ()
        return LaunchTimelineView(
            rung=launch.key.rung,
            model=launch.key.model,
            fingerprint=launch.key.fingerprint,
            started_at=iso(launch.started_wall),
            milestones=now_views,
            time_to_ready_s=launch.time_to_ready_s,
            longest_quiet_s={p: round(q, 3) for p, q in launch.longest.items()},
            last_good=good_views,
            last_good_time_to_ready_s=good.time_to_ready_s if good is not None else None,
            compared=compare(now_views, good_views),
            cache=launch.cache,
            residency=launch.residency,
        )

    def publish(self, snap: StatusSnapshot) -> StatusSnapshot:
        update: dict[str, Any] = {}
        launch = self.current
        if launch is not None:
            update["launch_timeline"] = self._timeline(launch)
        w = self.window_now
        if w is not None and snap.state == "starting":
            update["stall_window"] = StallWindowView(
                phase=w.phase,
                window_s=round(w.window_s, 3),
                source=w.source,
                why=w.why,
                configured_s=self.settings.watchdog.startup_stall_s,
                learned_quiet_s=w.learned_quiet_s,
            )
        if self.last_outage is not None:
            update["last_outage"] = self.last_outage
        if self.outage is not None:
            o = self.outage
            update["outage"] = OutageView(incident=o.incident, cause=o.cause, parts=dict(o.parts), daemon_s=o.daemon_s)
        return snap.model_copy(update=update) if update else snap


def _look(model: str, readahead: bool, limit: int) -> ResidencyView | None:
    files = residency.weight_files(model, limit)
    if not files:
        return None
    measured = residency.measure(files)
    error = residency.read_ahead(files) if readahead else None
    return measured.view(readahead).model_copy(update={"error": measured.error or error})
