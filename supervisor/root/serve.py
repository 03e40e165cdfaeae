"""`sglang-supervisor run`: one asyncio loop hosting the API (uvicorn) and the supervisor task.

Signals only enqueue commands (SIGTERM/SIGINT: shutdown, SIGHUP: reload, SIGUSR2: handoff). systemd hears READY=1
once the loop and the API run; the server's readiness is the API's business, not systemd's.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Generator, Mapping
from dataclasses import dataclass
from pathlib import Path

import structlog
import uvicorn
from prometheus_client import CollectorRegistry
from starlette.types import ASGIApp

from api.app import create_app
from api.browser import host_policy
from api.groupgate import LEADER_PATHS, MEMBER_PATHS, GroupGate, group_app
from api.streams import FollowSlots
from probes.gpu import GpuProbe
from probes.gpuscope import DeviceScope
from probes.ports import port_holders
from probes.xid import XidWatcher
from supervisor import __version__
from supervisor.alerting.dispatch import Alerter, NotifyMetrics, instance_name
from supervisor.clock import Clock, SystemClock
from supervisor.common import sigmask
from supervisor.common.apitoken import check_bind, load_token
from supervisor.common.configerror import ConfigError
from supervisor.common.exitcodes import EXIT_HANDOFF
from supervisor.config.settings import Settings
from supervisor.daemon.owner import Owner
from supervisor.daemon.server import child_env
from supervisor.group import members as grouping
from supervisor.group.peers import NoPeers, Peers
from supervisor.group.verdict import NodeReport
from supervisor.host import inherit
from supervisor.host.apiguard import raise_nofile_limit, uvicorn_options
from supervisor.host.instance_lock import StateLock, acquire, adopt
from supervisor.host.sdnotify import Notifier
from supervisor.logs.view import LogRedaction, server_log_file
from supervisor.metrics.exporter import SupervisorMetrics
from supervisor.process.cgroup import CgroupRoot, become_subreaper
from supervisor.process.control import RealProcessControl
from supervisor.root.gpusource import open_nvml
from supervisor.root.preflight import preflight
from supervisor.status.commands import Command
from supervisor.status.timeline import Timeline

log = structlog.get_logger(__name__)


API_TICK_S = 1.0


class _ApiServer(uvicorn.Server):
    """uvicorn without its own signal handling: the daemon's handlers enqueue commands instead.

    Its housekeeping loop ticks once a second, not uvicorn's ten times (issue 51: the ten wake-ups
    cost about 0.15 % of a core, a fifth of an idle daemon): the tick only refreshes the `date`
    header (once a second in uvicorn too) and looks at `should_exit`, and setting `should_exit`
    wakes it at once, so a stop is no slower."""

    _wake: asyncio.Future[None] | None = None
    _exit = False

    @property
    def should_exit(self) -> bool:
        return self._exit

    @should_exit.setter
    def should_exit(self, value: bool) -> None:
        self._exit = value
        if value and self._wake is not None and not self._wake.done():
            self._wake.set_result(None)

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield

    async def main_loop(self) -> None:
        counter = 0
        should_exit = await self.on_tick(counter)
        while not should_exit:
            counter = (counter + 10) % 864000  # a multiple of 10: on_tick's once-a-second work runs every tick
            await self._sleep(API_TICK_S)
            should_exit = await self.on_tick(counter)

    async def _sleep(self, seconds: float) -> None:
        loop = asyncio.get_running_loop()
        self._wake = wake = loop.create_future()
        timer = loop.call_later(seconds, _settle, wake)
        try:
            if not self._exit:
                await wake
        finally:
            timer.cancel()
            self._wake = None


def _settle(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


def bind_socket(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP explicitly: asyncio only turns off Nagle's algorithm for such sockets, and without
    # that every answer on a kept-open connection (a Prometheus scrape) waits ~40 ms.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as err:
        sock.close()
        held = api_port_holder(port)
        why = f"{err.strerror or err}{held}"
        raise ConfigError(f"api: cannot listen on {host}:{port}: {why} (set [api] port)") from None
    sock.listen(128)
    sock.setblocking(False)
    return sock


def api_port_holder(port: int) -> str:
    """`; held by another sglang-supervisor daemon (pid N)` when one listens there, else ""."""
    for pid in port_holders(port) or ():
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(b"sglang-supervisor" in a or a == b"supervisor" for a in argv):
            return f"; held by another sglang-supervisor daemon (pid {pid})"
    return ""


@dataclass
class Api:
    server: _ApiServer
    task: asyncio.Task[None]
    sock: socket.socket
    follows: FollowSlots | None = None
    host: str = ""  # as configured, which a handoff passes on with the socket
    port: int = 0

    def keep_listening(self) -> inherit.PassedListener:
        """For the handoff: a second descriptor of the listening socket, which `close` leaves open,
        so the port stays this process's through the re-exec (connections wait in its backlog)."""
        return inherit.PassedListener(os.dup(self.sock.fileno()), self.host, self.port)

    async def close(self) -> None:
        if self.follows is not None:  # open follows end their answers before uvicorn's grace runs out
            self.follows.close()
        self.server.should_exit = True
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.task, timeout=5)
        self.sock.close()


async def start_api(
    sup: Owner,
    settings: Settings,
    env: Mapping[str, str],
    registry: CollectorRegistry,
    timeline: Timeline | None = None,
    sock: socket.socket | None = None,
) -> Api:
    """`sock`: the listening socket the previous image passed on (a handoff), else one is bound."""
    token = load_token(settings.api, env)
    check_bind(settings.api.host, token)
    if sock is None:
        sock = bind_socket(settings.api.host, settings.api.port)
    redaction = LogRedaction(sup.settings, dict(env))

    def redact(text: str) -> str:
        redaction.update(sup.settings)  # a reload may bring new secrets
        return redaction(text)

    app = create_app(
        sup,
        token=token,
        diag_dir=settings.state_dir / "diagnostics",
        journal=sup.journal,
        registry=registry,
        max_body_bytes=settings.api.max_body_bytes,
        liveness=sup.pulse.age,
        version=__version__,
        log_file=server_log_file(settings),
        redact=redact,
        timeline=timeline,
        hosts=host_policy(settings.api.host, settings.api.allowed_hosts),
        # the daemon's own polls of the server, whose access lines `logs` hides unless --all
        probe_paths=frozenset({settings.watchdog.health_path, settings.watchdog.metrics_path, "/get_server_info"}),
    )
    served: ASGIApp = app
    member_api = sup.peers.member_api(time.monotonic)
    if member_api is not None:  # the member API the group's leader calls (api/group.py)
        def report() -> NodeReport:  # this node's report to its group's leader
            return sup.peers.report(sup.snapshot(), sup.server.history, sup.server.obs, time.time())

        endpoint = grouping.GroupEndpoint(sup.snapshot, report, sup.submit, member_api.join)
        # Signed by the group's keys, outside the bearer-token app (api/groupgate.py).
        paths = LEADER_PATHS if member_api.leads else MEMBER_PATHS
        limit = settings.api.max_body_bytes
        gate = GroupGate(app, group_app(endpoint), member_api.check, wall=time.time, max_body_bytes=limit, paths=paths)
        served = gate
    config = uvicorn.Config(
        served,
        log_config=None,
        access_log=False,
        lifespan="off",
        timeout_graceful_shutdown=2,
        **uvicorn_options(sup.api_guard),
    )
    server = _ApiServer(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    for _ in range(500):
        if server.started or task.done():
            break
        await asyncio.sleep(0.01)
    if task.done():
        task.result()
    log.info("api_listening", host=settings.api.host, port=settings.api.port, auth=token is not None)
    return Api(server, task, sock, app.state.context.follows, settings.api.host, settings.api.port)


def taken_listener(sup: Owner, settings: Settings, inherited: inherit.Inherited) -> socket.socket | None:
    """The listening socket the previous image passed on, when it is the configured address; what
    was taken over, or why not, is journaled (`handoff_inherited`)."""
    sock: socket.socket | None = None
    why: list[str] = list(inherited.ignored)
    if inherited.listener is not None:
        got = inherit.adopt_listener(inherited.listener, settings.api.host, settings.api.port)
        if isinstance(got, str):
            why.append(f"listener: {got}; bound afresh")
        else:
            sock = got
    if inherited.listener is not None or inherited.lock is not None or why:
        sup.record(
            "handoff_inherited",
            "info" if not why else "warning",
            listener=sock is not None,
            lock=inherited.lock is not None and not any(w.startswith("lock:") for w in why),
            ignored="; ".join(why) or None,
        )
    return sock


def make_owner(
    settings: Settings,
    env: Mapping[str, str],
    registry: CollectorRegistry,
    *,
    config_path: Path | None,
    notifier: Notifier,
    clock: Clock,
    timeline: Timeline,
) -> Owner:
    """The owner, given everything it needs: its probes, its process control, its peers."""
    subreaper = become_subreaper()
    cgroups, why = CgroupRoot.find()
    log.info("containment", subreaper=subreaper, cgroup=why)
    scope = DeviceScope.for_server(settings.server.env, env)
    log.info("gpu_scope", gpus=scope.describe(), source=settings.gpu.describe())
    runtime = grouping.make_runtime(settings, clock.monotonic)
    peers: Peers = grouping.group_peers(runtime) if runtime is not None else NoPeers()
    watcher = XidWatcher(open_nvml(settings.gpu))  # its own NVML handle: waits block in its thread
    sup = Owner(
        settings,
        clock=clock,
        metrics=lambda snap: SupervisorMetrics(registry, snap),
        gpu=GpuProbe(open_nvml(settings.gpu), scope=scope),
        env=env,
        config_path=config_path,
        notifier=notifier,
        version=__version__,
        control=RealProcessControl(cgroups, subreaper=subreaper),
        peers=peers,
        xid_watcher=watcher,
        publish_listeners=(timeline.feed,),
    )
    sup.record("containment", only="journal", subreaper=subreaper, cgroup=why, cgroup_in_use=cgroups is not None)
    sup.record("gpu_scope", only="journal", gpus=scope.describe(), source=settings.gpu.source)
    watcher.start()
    return sup


def start_alerter(sup: Owner, settings: Settings, metrics: NotifyMetrics) -> Alerter:
    """The [[notify]] lanes, listening to the journal; ConfigError when a secret file is unreadable."""
    alerter = Alerter(
        settings.notify,
        journal=sup.journal,
        metrics=metrics,
        instance=instance_name(settings.server.host, settings.server.port),
        hook_env=child_env(sup.settings, sup.env, {}),  # the daemon's environment, less its API token and sockets
        preferred=lambda: sup.settings.ladder[0].name if sup.settings.ladder else None,  # as reloaded
    )
    alerter.start()
    sup.recorder.subscribe_journal(alerter.offer)
    return alerter


def install_signals(
    sup: Owner,
    config_path: Path | None = None,
    env: Mapping[str, str] | None = None,
    api_at: Callable[[], tuple[str, int]] | None = None,
) -> None:
    """`api_at`: where the API listens now, which the handoff's preflight must find in the new code's config."""
    loop = asyncio.get_running_loop()
    proving: list[asyncio.Task[None]] = []  # the handoff's preflight in flight (one at a time)

    def enqueue(kind: str, sig: signal.Signals | None = None) -> None:
        if sig is not None and sup.leaving == "handoff" and sigmask.held():
            # The re-exec is under way (serve held the signals): this one was taken by a worker thread
            # that does not block it. Pending on the main thread it crosses the exec, and the new
            # image's handlers get it instead of this daemon's closed queue.
            signal.pthread_kill(threading.main_thread().ident or 0, sig)
            return
        sup.queue.put_nowait(Command(kind=kind, source="signal", reason=f"signal ({kind})"))  # type: ignore[arg-type]

    async def prove_then_hand_off() -> None:
        """The successor's code validates the config first (supervisor.root.preflight); refused:
        the old daemon stays in charge and says why."""
        why = await preflight(config_path, env if env is not None else {}, api=api_at() if api_at else None)
        if why is None:
            enqueue("handoff")
            return
        sup.record("handoff_refused", "warning", reason=why, config=str(config_path))

    def handoff() -> None:
        if sup.leaving == "handoff" and sigmask.held():
            signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGUSR2)  # as in enqueue
            return
        if proving and not proving[-1].done():
            return  # a second SIGUSR2 while the first is being proved
        proving[:] = [asyncio.create_task(prove_then_hand_off())]

    loop.add_signal_handler(signal.SIGTERM, enqueue, "shutdown", signal.SIGTERM)
    loop.add_signal_handler(signal.SIGINT, enqueue, "shutdown")
    loop.add_signal_handler(signal.SIGUSR2, handoff)
    loop.add_signal_handler(signal.SIGHUP, enqueue, "reload", signal.SIGHUP)
    sigmask.release()  # what arrived since the process started (held by sigmask.hold) is queued now


async def serve(
    settings: Settings,
    *,
    env: Mapping[str, str],
    config_path: Path | None,
    ready: asyncio.Event | None = None,
    holder: list[Owner] | None = None,
    signals: bool = True,
    inherited: inherit.Inherited | None = None,
    handover: list[inherit.Handover] | None = None,
) -> int:
    """Run the daemon until a shutdown command, which stops the server tree on the way out.

    After a handoff (SIGUSR2) the server keeps running for the successor to adopt, and the exit
    status is EXIT_HANDOFF, on which `run` re-executes itself in place. `inherited`: what the
    previous image passed across that exec; `handover`: where this one leaves what it passes on
    (the listening socket and the locked state directory; None: it closes and releases them).
    """
    inherited = inherited if inherited is not None else inherit.Inherited()
    ignored = list(inherited.ignored)
    lock: StateLock | None = None
    if inherited.lock is not None:
        kept = adopt(settings.state_dir, inherited.lock)
        lock = kept if isinstance(kept, StateLock) else None
        if isinstance(kept, str):
            ignored.append(f"lock: {kept}")
    if lock is None:
        lock = acquire(settings.state_dir)  # before anything looks at the server: StateDirLocked
    passing: list[inherit.PassedListener] = []
    code: int | None = None
    try:
        code = await _serve_locked(
            settings,
            lock,
            env=env,
            config_path=config_path,
            ready=ready,
            holder=holder,
            signals=signals,
            inherited=inherit.Inherited(inherited.listener, inherited.lock, tuple(ignored)),
            passing=passing if handover is not None else None,
        )
        return code
    finally:
        if code == EXIT_HANDOFF and handover is not None:
            handover.append(inherit.Handover(passing[0] if passing else None, lock.pass_on()))
        else:
            for kept_fd in passing:
                inherit.close_fd(kept_fd.fd)
            lock.release()


async def _serve_locked(
    settings: Settings,
    lock: StateLock,
    *,
    env: Mapping[str, str],
    config_path: Path | None,
    ready: asyncio.Event | None,
    holder: list[Owner] | None,
    signals: bool,
    inherited: inherit.Inherited,
    passing: list[inherit.PassedListener] | None,
) -> int:
    soft, hard = raise_nofile_limit()
    log.info("nofile_limit", soft=soft, hard=hard)
    notifier = Notifier.from_env(env)
    registry = CollectorRegistry()
    clock = SystemClock()
    timeline = Timeline(clock.monotonic)
    sup = make_owner(
        settings, env, registry, config_path=config_path, notifier=notifier, clock=clock, timeline=timeline
    )
    if holder is not None:
        holder.append(sup)
    notify_metrics = NotifyMetrics(registry)
    alerter = start_alerter(sup, settings, notify_metrics)
    retired: list[asyncio.Task[None]] = []  # alerters replaced by a reload, finishing their queues
    listener = taken_listener(sup, settings, inherited)
    try:
        api = await start_api(sup, settings, env, registry, timeline, sock=listener)
    except BaseException:
        if listener is not None:
            listener.close()
        raise

    current = settings

    async def on_reload(new: Settings) -> None:
        """Rebind the API when its settings changed; a refused new API config keeps the old one."""
        nonlocal api, current, alerter
        if new.gpu != current.gpu:  # the probes hold the NVML they were built with
            raise ConfigError(
                f"[gpu] changed ({current.gpu.describe()} -> {new.gpu.describe()}): a reload cannot swap the "
                "GPU probes' NVML; restart the daemon (systemctl restart) to apply it"
            )
        if new.notify != current.notify or new.server.port != current.server.port:
            fresh = start_alerter(sup, new, notify_metrics)  # an unreadable secret file refuses the reload here
            sup.recorder.unsubscribe_journal(alerter.offer)
            retired.append(asyncio.create_task(alerter.close(grace_s=5.0)))  # its queue drains aside
            alerter = fresh
        if new.api != current.api:
            token = load_token(new.api, env)  # raises ConfigError before anything is torn down
            check_bind(new.api.host, token)
            await api.close()
            try:
                api = await start_api(sup, new, env, registry, timeline)
            except ConfigError:
                api = await start_api(sup, current, env, registry, timeline)
                raise
        current = new

    sup.on_reload = on_reload
    if signals:
        install_signals(sup, config_path, env, api_at=lambda: (api.host, api.port))
    notifier.ready()
    if ready is not None:
        ready.set()
    try:
        await sup.run()
    finally:
        if sup.leaving == "handoff":
            lock.announce_handoff()
            if passing is not None:  # `run` re-executes next
                # From here to the new image's handlers SIGTERM/SIGHUP/SIGUSR2 wait (pending, carried
                # across the exec) instead of meeting a closed queue or, once the loop is closed,
                # their default action.
                sigmask.hold()
                passing.append(api.keep_listening())
        await asyncio.gather(alerter.close(), *retired, return_exceptions=True)
        await api.close()
        if sup.xid_watcher is not None:
            await asyncio.to_thread(sup.xid_watcher.stop)
    code = sup.peers.exit_code if sup.peers.exit_code is not None else 0
    log.info("daemon_exit", state=sup.snapshot().state, handoff=(sup.leaving == "handoff"), code=code)
    return EXIT_HANDOFF if (sup.leaving == "handoff") else code
