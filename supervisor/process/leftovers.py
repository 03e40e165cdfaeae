"""What an earlier daemon left running: found by its marker, by the marker of whoever holds the
server port (a lost or malformed state.json loses the marker, not the tree), and by its cgroups.

A tree on the port with another marker is stopped only when it is provably a leftover: its
published state directory's lock is free (its daemon is dead). One whose daemon holds its lock is
that daemon's, and one whose daemon cannot be found is nobody's to stop (supervisor.process.owners):
both are kept, and `kept_on_port` names them for the launch's refusal."""

from __future__ import annotations

import time

from probes.ports import port_holders
from probes.proctree import MARKER_ENV
from supervisor.process import StopReport, kill_marked, wait_port
from supervisor.process.cgroup import CgroupRoot
from supervisor.process.owners import TreeOwner, foreign_owners, markers_of


def port_markers(port: int, proc_root: str = "/proc") -> tuple[str, ...]:
    """The markers carried by whoever listens on `port`: a tree some supervisor launched there."""
    found: set[str] = set()
    prefix = f"{MARKER_ENV}=".encode()
    for pid in port_holders(port) or ():
        try:
            with open(f"{proc_root}/{pid}/environ", "rb") as f:
                environ = f.read()
        except OSError:
            continue
        for item in environ.split(b"\0"):
            if item.startswith(prefix) and len(item) > len(prefix):
                found.add(item[len(prefix) :].decode("utf-8", "replace"))
    return tuple(sorted(found))


def port_owners(port: int, ours: tuple[str, ...], proc_root: str = "/proc") -> list[TreeOwner]:
    """The owner of every tree on `port` that another marker than `ours` put there."""
    return foreign_owners(markers_of(port_holders(port) or (), proc_root), ours, proc_root)


def kept_on_port(port: int, ours: tuple[str, ...] = (), proc_root: str = "/proc") -> str | None:
    """Why a tree on `port` is not this daemon's to stop, in words (another live daemon's, or one
    whose daemon cannot be found); None when no such tree holds it."""
    kept = [o for o in port_owners(port, ours, proc_root) if o.kind != "dead"]
    if not kept:
        return None
    return "; ".join(f"{o.describe()} holds port {port}" for o in kept)


def kill_leftovers(
    markers: str | tuple[str, ...],
    host: str,
    port: int,
    *,
    grace_s: float = 2.0,
    port_wait_s: float = 5.0,
    cgroups: CgroupRoot | None = None,
) -> StopReport:
    """At daemon start: stop the trees with `markers` (the saved one first, then this state
    directory's derived one when an older version saved another), and any tree another marker put
    on `port` (a state.json lost or malformed loses the marker, not the tree); the port is
    verified free. The one sweep of leftovers: the daemon calls it through `ProcessControl`.

    A tree on the port is stopped only when it is this state directory's (it publishes it) or its
    own daemon is provably dead (its lock is free); a live daemon's tree and one whose daemon
    cannot be found are left alone, and the port is not waited for (`kept_on_port` says why)."""
    ours = [markers] if isinstance(markers, str) else list(dict.fromkeys(m for m in markers if m))
    carriers = markers_of(port_holders(port) or ())
    owners = {o.marker: o for o in foreign_owners(carriers, ours)}
    mine_by_dir = [m for m in carriers if m not in ours and m not in owners]
    dead = [m for m, o in owners.items() if o.kind == "dead"]
    every = [*ours, *mine_by_dir, *dead]
    reports = [kill_marked(m, grace_s=grace_s) for m in every]
    from_cgroup: set[int] = set()
    for marker in ours:
        for cg in cgroups.leftovers_of(marker) if cgroups is not None else ():
            killed, _ = cg.kill_and_remove()
            from_cgroup.update(killed)
    if any(o.kind != "dead" for o in owners.values()) or not (from_cgroup or any(r.pids_found for r in reports)):
        port_wait_s = 0.0  # a kept tree holds it, or nothing was stopped: waiting would not free it
    start = time.monotonic()
    port_free, holders = wait_port(host, port, start + port_wait_s, time.sleep, time.monotonic)

    def union(attr: str, extra: set[int] | None = None) -> tuple[int, ...]:
        return tuple(sorted({pid for r in reports for pid in getattr(r, attr)} | (extra or set())))

    return StopReport(
        pids_found=union("pids_found", from_cgroup),
        termed=union("termed"),
        killed=union("killed", from_cgroup),
        survivors=union("survivors"),
        port_free=port_free,
        port_holders=holders,
        exit_code=None,
        duration_s=sum(r.duration_s for r in reports) + time.monotonic() - start,
        grace_expired=any(r.grace_expired for r in reports),
    )
