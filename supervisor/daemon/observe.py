"""One poll's observation: runs every probe off the event loop and assembles an `Observation`.

Blocking probes (/proc, sockets, NVML) run together in one worker thread. HTTP probes are
background tasks: a health request may legitimately take SGLang's 20 s, so the poll never waits
for it; its answer is attached to the first poll after it lands. Never two health probes at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from probes.busy import BusyProbe
from probes.gpm import GpmProbe
from probes.gpu import GpuProbe
from probes.http import Canary, HealthProbe
from probes.logs import LogParser
from probes.ports import PortsProbe
from probes.proctree import ProcessTreeProbe
from probes.ras import RasProbe, RasReport, ras_address
from probes.serving import ServingProbe
from probes.sglang_watchdog import SGLangWatchdogParser
from probes.starvation import StarvationProbe
from probes.types import (
    BusySample,
    GpmObservation,
    GpuObservation,
    HealthObservation,
    LogLine,
    Observation,
    PortsObservation,
    SchedObservation,
    ServingObservation,
    TreeObservation,
)
from supervisor.config.settings import Settings
from supervisor.diagnostics.tools import find_py_spy
from supervisor.engines import SGLANG, EngineProfile
from supervisor.policy.canary import CanaryState, answered, sent, wants_canary
from supervisor.status.snapshot import ToolCheck


@dataclass(frozen=True)
class Target:
    """What is being watched this poll."""

    root_pid: int | None
    root_exit: int | None
    marker: str
    serving: bool  # the server reached ready: probe health at its interval, scrape /metrics
    metrics: bool  # the rung runs with --enable-metrics
    look: bool = False  # take a py-spy look at the busy processes (watchdog: CPU the only channel)


def _base_url(host: str, port: int) -> str:
    h = host
    if h in ("0.0.0.0", ""):
        h = "127.0.0.1"
    elif h == "::":
        h = "::1"
    if ":" in h:
        h = f"[{h}]"
    return f"http://{h}:{port}"


class Observer:
    def __init__(self, settings: Settings, gpu: GpuProbe, monotonic: Callable[[], float]) -> None:
        self._monotonic = monotonic
        self._closing: set[asyncio.Future[None]] = set()
        self.gpu = gpu
        self.gpm = GpmProbe(gpu.nvml)
        # Thread states are for the bundles (which read /proc themselves), not for every poll.
        self.tree_probe = ProcessTreeProbe(with_threads=False)
        self.sched_probe = StarvationProbe()
        # How late the owner's loop started this poll (set by the owner before each tick).
        self.loop_lag_s = 0.0
        self.profile: EngineProfile = SGLANG  # the launch's engine: `reset` sets it per launch
        self.configure(settings)
        self.parser = LogParser(self.profile.log)
        self.sglang_watchdog = SGLangWatchdogParser()
        self._health_task: asyncio.Task[HealthObservation] | None = None
        self._serving_task: asyncio.Task[ServingObservation] | None = None
        self._health_started_at: float | None = None
        self._scraped_at: float | None = None
        self.last_health: HealthObservation | None = None
        self.last_serving: ServingObservation | None = None
        self.last_busy: BusySample | None = None
        self._canary = CanaryState()  # the last canary generation (policy/canary.py)
        self._health_canary = False  # whether the health check in flight carries one

    def configure(self, settings: Settings) -> None:
        self.settings = settings
        srv, wd = settings.server, settings.watchdog
        url = _base_url(srv.host, srv.port)
        old = [p for p in (getattr(self, "health_probe", None), getattr(self, "serving_probe", None)) if p is not None]
        if old:  # each owns an httpx client, perhaps with a request of ours still on it
            self._closing.add(asyncio.ensure_future(self._retire(self._take_requests(), old)))
        self.ports_probe = PortsProbe(srv.host, srv.port)
        old_ras: RasProbe | None = getattr(self, "ras_probe", None)
        if old_ras is not None:
            old_ras.close()
        self.ras_probe: RasProbe = RasProbe(ras_address(srv.env), interval_s=wd.ras_interval_s)
        d = settings.diagnostics
        spy = find_py_spy(d.py_spy_path) if d.py_spy else None
        self.busy_probe = BusyProbe(spy, timeout_s=wd.busy_sample_timeout_s, monotonic=self._monotonic)
        if not d.py_spy:
            self.busy_probe.disabled = "py-spy is off ([diagnostics] py_spy = false)"
        p = self.profile
        canary = Canary(p.canary_path, p.canary_body) if p.health == "flag" else None
        self.health_probe = HealthProbe(
            url, wd.health_path, wd.health_timeout_s, monotonic=self._monotonic, canary=canary
        )
        self.serving_probe = ServingProbe(
            url, wd.metrics_path, wd.metrics_timeout_s, monotonic=self._monotonic, names=p.metrics
        )

    def gpm_check(self) -> ToolCheck:
        """The self-check's line for GPM (blocking: NVML). Without it the busy-hang rule has py-spy only."""
        ok, detail = self.gpm.support(self.gpu.snapshot_all())
        instead = "" if ok else "power draw against idle where NVML reads it, else py-spy looks (see busy-signal)"
        return ToolCheck(name="gpm", ok=ok, detail=detail, kind="capability", instead=instead)

    def gpu_source_checks(self) -> tuple[ToolCheck, ...]:
        """The self-check's line saying the GPU is the simulator's (none with the real NVML), so an
        operator never mistakes simulated readings for a GPU's."""
        gpu = self.settings.gpu
        if not gpu.simulated:
            return ()
        return (ToolCheck(name="gpu", ok=True, detail=f"simulated: {gpu.describe()}"),)

    def reset(self, profile: EngineProfile | None = None) -> None:
        """A new launch: a fresh log parser and no stale HTTP answers; `profile`: the engine it runs,
        when that changes (a ladder that crosses engines), the probes that read it are rebuilt."""
        if profile is not None and profile != self.profile:
            self.profile = profile
            self.tree_probe = ProcessTreeProbe(with_threads=False, titles=profile.titles)
            self.configure(self.settings)
        self.parser = LogParser(self.profile.log)
        self.sglang_watchdog = SGLangWatchdogParser()
        self.health_probe.cancel()  # the shared request belongs to the old server
        for task in (self._health_task, self._serving_task):
            if task is not None:
                task.cancel()
        self._health_task = self._serving_task = None
        self._health_started_at = self._scraped_at = None
        self.last_health = self.last_serving = None
        self.last_busy = None
        self._canary, self._health_canary = CanaryState(), False

    def mark_serving(self) -> None:
        self.parser.serving()

    def feed(self, lines: list[LogLine]) -> None:
        self.parser.feed(lines)
        self.sglang_watchdog.feed(lines)

    def _blocking(
        self, t: Target
    ) -> tuple[TreeObservation, PortsObservation, GpuObservation, GpmObservation, BusySample | None, SchedObservation]:
        tree = self.tree_probe.observe(t.root_pid, t.marker, t.root_exit)
        sched = self.sched_probe.observe(tree.pids)
        # New listening ports are a start-up progress channel; once serving, the port is known.
        ports = self.ports_probe.observe(() if t.serving else tree.pids)
        gpu = self.gpu.observe(tree.pids)
        gpm = self.gpm.observe(gpu)
        rates = self.busy_probe.note(tree)
        busy = self.busy_probe.sample(rates) if t.look and tree.root_alive else None
        return tree, ports, gpu, gpm, busy, sched

    def _ras(self, alive: bool) -> RasReport | None:
        """A RAS report finished since the last poll, while the server lives (the detector's input)."""
        return self.ras_probe.observe(self._monotonic()) if alive else None

    async def observe(self, t: Target) -> Observation:
        tree, ports, gpu, gpm, busy, sched = await asyncio.to_thread(self._blocking, t)
        lag, self.loop_lag_s = self.loop_lag_s, 0.0  # one lag belongs to one poll
        if busy is not None:
            self.last_busy = busy
        now = self._monotonic()
        health = self._take_health()
        serving = self._take_serving()
        # Once serving, a port that stops accepting is a failed health check, not a reason to stop
        # checking: otherwise a server that closed its socket stayed `ready` forever.
        if tree.root_alive and (ports.server_port_accepts or t.serving):
            self._maybe_probe_health(now, t.serving, self._wants_canary(t.serving, now))
        if ports.server_port_accepts and tree.root_alive:
            self._maybe_scrape(now, t)
        return Observation(
            at=now,
            tree=tree,
            ports=ports,
            logs=self.parser.observe(),
            gpu=gpu,
            health=health,
            serving=serving,
            gpm=gpm,
            busy=busy,
            sglang_watchdog=self.sglang_watchdog.observe(),
            sched=sched,
            loop_lag_s=lag,
            ras=self._ras(tree.root_alive),
        )

    def _maybe_scrape(self, now: float, t: Target) -> None:
        if not (t.serving and t.metrics) or self._serving_task is not None:
            return
        if self._scraped_at is not None and now - self._scraped_at < self.settings.watchdog.metrics_interval_s:
            return
        self._scraped_at = now
        self._serving_task = asyncio.create_task(self.serving_probe.observe())

    def _wants_canary(self, serving: bool, now: float) -> bool:
        """An engine whose /health is a flag (vLLM) gets a one-token generation with it: at start-up
        (ready is a generation answered), and while serving idle at most once a serving window
        (issue 51), every check after one failed (supervisor/policy/canary.py)."""
        window = self.settings.watchdog.serving_stall_s
        return wants_canary(self.profile.health == "flag", serving, self.last_serving, self._canary, now, window)

    def _maybe_probe_health(self, now: float, serving: bool, canary: bool = False) -> None:
        if self._health_task is not None:
            return
        interval = self.settings.watchdog.health_interval_s if serving else self.settings.watchdog.poll_interval_s
        if self._health_started_at is not None and now - self._health_started_at < interval:
            return
        self._health_started_at = now
        self._health_canary = canary
        if canary:
            self._canary = sent(self._canary, now)
        self._health_task = asyncio.create_task(self.health_probe.probe(canary=canary))

    def _take_health(self) -> HealthObservation | None:
        task = self._health_task
        if task is None or not task.done():
            return None
        self._health_task = None
        if task.cancelled() or task.exception() is not None:
            return None
        self.last_health = task.result()
        if self._health_canary:
            self._canary = answered(self._canary, self.last_health.ok)
        return self.last_health

    def _take_serving(self) -> ServingObservation | None:
        task = self._serving_task
        if task is None or not task.done():
            return None
        self._serving_task = None
        if task.cancelled() or task.exception() is not None:
            return None
        self.last_serving = task.result()
        return self.last_serving

    def _take_requests(self) -> list[asyncio.Task[Any]]:
        """The health and scrape requests in flight, cancelled and no longer ours to read."""
        tasks = [t for t in (self._health_task, self._serving_task) if t is not None]
        for task in tasks:
            task.cancel()
        self._health_task = self._serving_task = None
        return tasks

    @staticmethod
    async def _retire(tasks: list[asyncio.Task[Any]], probes: list[HealthProbe | ServingProbe]) -> None:
        """Close probes' clients only once their requests have ended. A client closed while one of
        its requests was still connecting let that connection in after the pool had shut: a socket
        no one would ever close (the suite's 'unclosed transport' ResourceWarnings)."""
        await asyncio.gather(*tasks, return_exceptions=True)
        for probe in probes:
            await probe.aclose()

    async def close(self) -> None:
        requests = self._take_requests()
        self.reset()
        await self._retire(requests, [self.health_probe, self.serving_probe])
        if self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)
        await asyncio.to_thread(self.gpm.close)
        await asyncio.to_thread(self.gpu.close)
        self.ras_probe.close()
