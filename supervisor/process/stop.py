"""Stopping a server tree: TERM, a grace, KILL, then verify that no member is left and the port is free."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from probes.ports import port_holders, port_is_free
from probes.proctree import ProcStat, read_stat, scan_tree
from supervisor.process.cgroup import LaunchCgroup, adopted_orphans, reap_orphans
from supervisor.process.signals import signal_member
from supervisor.process.spawn import ChildHandle

POLL_S = 0.05


@dataclass(frozen=True)
class StopReport:
    pids_found: tuple[int, ...]  # every member seen during the stop, zombies included
    termed: tuple[int, ...]  # members sent SIGTERM
    killed: tuple[int, ...]  # members still alive after the grace, sent SIGKILL
    survivors: tuple[int, ...]  # alive at the end: should be empty
    port_free: bool  # True when no port was to be checked
    port_holders: tuple[int, ...]  # pids still listening on the port at the end
    exit_code: int | None  # the main process's, once reaped; -N for signal N
    duration_s: float
    grace_expired: bool

    @property
    def ok(self) -> bool:
        return not self.survivors and self.port_free


class _Stop:
    """One stop: TERM, grace, KILL, verify. Re-finds the tree at every step (members fork)."""

    def __init__(
        self,
        root: ChildHandle | None,
        marker: str,
        proc_root: str,
        sleep: Callable[[float], None],
        monotonic: Callable[[], float],
        cgroup: LaunchCgroup | None = None,
        adopt_orphans: bool = False,
    ) -> None:
        self.root = root
        self.marker = marker
        self.cgroup = cgroup
        self.adopt_orphans = adopt_orphans
        self.proc_root = proc_root
        self.sleep = sleep
        self.monotonic = monotonic
        self.seen: dict[int, ProcStat] = {}
        self.termed: set[int] = set()
        self.killed: set[int] = set()

    def live(self) -> dict[int, ProcStat]:
        # Once reaped, the root's pid may be reused: only an unreaped root seeds the scan.
        seed = self.root.pid if self.root is not None and self.root.poll() is None else None
        known = {pid: st.starttime for pid, st in self.seen.items()}
        for st in self.held_elsewhere():
            known.setdefault(st.pid, st.starttime)
        members = scan_tree(seed, self.marker, self.proc_root, known=known)
        self.seen.update(members)
        return {pid: st for pid, st in members.items() if not st.zombie}

    def held_elsewhere(self) -> list[ProcStat]:
        """Members that neither descent nor the marker shows: the launch cgroup's processes, and
        orphans of the tree re-parented to this daemon (a subreaper)."""
        pids = set(self.cgroup.procs()) if self.cgroup is not None else set()
        if self.adopt_orphans:
            pids |= {st.pid for st in adopted_orphans(self.proc_root)}
        return [st for pid in pids if (st := read_stat(pid, self.proc_root)) is not None]

    def signal_all(self, live: Mapping[int, ProcStat], sig: int, sent: set[int], *, group: bool = True) -> None:
        pgid = self._signal_group(live, sig) if group else None
        for st in live.values():
            # A member the group signal reached may be gone before its own signal: it was still sent one.
            if signal_member(st, sig, self.proc_root) or st.pgid == pgid:
                sent.add(st.pid)

    def _signal_group(self, live: Mapping[int, ProcStat], sig: int) -> int | None:
        """Signal the root's group; returns its id when the signal went out."""
        # The group id is the root's pid: safe to use while the root is unreaped, or while a
        # member we just saw still belongs to that group (the kernel keeps the id reserved).
        if self.root is None:
            return None
        pgid = self.root.pid
        if self.root.poll() is not None and not any(st.pgid == pgid for st in live.values()):
            return None
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            return None
        return pgid

    def wait_terminated(self, live: dict[int, ProcStat], until: float) -> dict[int, ProcStat]:
        """Poll until all exited or `until`; a member forked meanwhile gets its own SIGTERM (once)."""
        while live and self.monotonic() < until:
            self.sleep(POLL_S)
            live = self.live()
            new = {pid: st for pid, st in live.items() if pid not in self.termed}
            if new:
                self.signal_all(new, signal.SIGTERM, self.termed, group=False)
        return live

    def wait_killed(self, live: dict[int, ProcStat], until: float) -> dict[int, ProcStat]:
        while live and self.monotonic() < until:
            self.sleep(POLL_S)
            live = self.live()
            if live:
                self.signal_all(live, signal.SIGKILL, self.killed)
        return live


def _stop(
    root: ChildHandle | None,
    marker: str,
    endpoint: tuple[str, int] | None,
    grace_s: float,
    kill_wait_s: float,
    port_wait_s: float,
    sleep: Callable[[float], None],
    monotonic: Callable[[], float],
    proc_root: str,
    cgroup: LaunchCgroup | None = None,
    adopt_orphans: bool = False,
) -> StopReport:
    start = monotonic()
    stop = _Stop(root, marker, proc_root, sleep, monotonic, cgroup, adopt_orphans)
    live = stop.live()
    stop.signal_all(live, signal.SIGTERM, stop.termed)
    live = stop.wait_terminated(live, start + grace_s)
    grace_expired = bool(live)
    if live:
        stop.signal_all(live, signal.SIGKILL, stop.killed)
        live = stop.wait_killed(live, monotonic() + kill_wait_s)
    if cgroup is not None:  # whatever is still inside, however it hid, goes with the cgroup
        killed, _ = cgroup.kill_and_remove(kill_wait_s, sleep=sleep)
        stop.killed.update(killed)
        live = stop.live()
    if adopt_orphans:
        reap_orphans(exclude=(root.pid,) if root is not None else (), proc_root=proc_root)
    port_free: bool = True
    holders: tuple[int, ...] = ()
    if endpoint is not None:
        port_free, holders = wait_port(*endpoint, monotonic() + port_wait_s, sleep, monotonic)
    return StopReport(
        pids_found=tuple(sorted(stop.seen)),
        termed=tuple(sorted(stop.termed)),
        killed=tuple(sorted(stop.killed)),
        survivors=tuple(sorted(live)),
        port_free=port_free,
        port_holders=holders,
        exit_code=root.poll() if root is not None else None,
        duration_s=monotonic() - start,
        grace_expired=grace_expired,
    )


def wait_port(
    host: str, port: int, until: float, sleep: Callable[[float], None], monotonic: Callable[[], float]
) -> tuple[bool, tuple[int, ...]]:
    while True:
        if port_is_free(host, port):
            return True, ()
        if monotonic() >= until:
            return False, port_holders(port) or ()
        sleep(POLL_S)


def stop_tree(
    root: ChildHandle | None,
    marker: str,
    host: str,
    port: int,
    grace_s: float,
    *,
    sleep: Callable[[float], None] = time.sleep,
    monotonic: Callable[[], float] = time.monotonic,
    port_wait_s: float = 5.0,
    kill_wait_s: float = 10.0,
    proc_root: str = "/proc",
    adopt_orphans: bool = False,
) -> StopReport:
    """Stop the whole tree and verify it is gone and the port free. Blocking: run it in a thread.

    SIGTERM goes to the root's group and to every member (members may sit in other groups);
    SGLang's own SIGTERM handling has no upper bound, so after `grace_s` whatever is left gets
    SIGKILL, then up to `kill_wait_s` for the kernel to tear it down (GPU contexts take seconds).
    """
    if not marker:
        raise ValueError("stop_tree needs the marker the tree was launched with")
    # A launched or an adopted root may carry its launch cgroup (supervisor.process.control.AdoptedChild).
    found = getattr(root, "cgroup", None)
    cgroup = found if isinstance(found, LaunchCgroup) else None
    return _stop(
        root,
        marker,
        (host, port),
        grace_s,
        kill_wait_s,
        port_wait_s,
        sleep,
        monotonic,
        proc_root,
        cgroup,
        adopt_orphans,
    )


def kill_marked(
    marker: str,
    *,
    grace_s: float = 2.0,
    host: str | None = None,
    port: int | None = None,
    sleep: Callable[[float], None] = time.sleep,
    monotonic: Callable[[], float] = time.monotonic,
    port_wait_s: float = 5.0,
    kill_wait_s: float = 10.0,
    proc_root: str = "/proc",
) -> StopReport:
    """Stop whatever a previous daemon instance left running with `marker` (at daemon start).

    The port is verified only when both `host` and `port` are given.
    """
    if not marker:
        raise ValueError("kill_marked needs a non-empty marker")
    endpoint = (host, port) if host is not None and port is not None else None
    return _stop(None, marker, endpoint, grace_s, kill_wait_s, port_wait_s, sleep, monotonic, proc_root)
