"""What an earlier daemon left running: found by its marker, by the marker of whoever holds the
server port (a lost or malformed state.json loses the marker, not the tree), and by its cgroups."""

from __future__ import annotations

import time

from probes.ports import port_holders
from probes.proctree import MARKER_ENV
from supervisor.process import StopReport, kill_marked, wait_port
from supervisor.process.cgroup import CgroupRoot


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
    verified free. The one sweep of leftovers: the daemon calls it through `ProcessControl`."""
    ours = [markers] if isinstance(markers, str) else list(dict.fromkeys(m for m in markers if m))
    every = [*ours, *(m for m in port_markers(port) if m not in ours)]
    reports = [kill_marked(m, grace_s=grace_s) for m in every]
    from_cgroup: set[int] = set()
    for marker in ours:
        for cg in cgroups.leftovers_of(marker) if cgroups is not None else ():
            killed, _ = cg.kill_and_remove()
            from_cgroup.update(killed)
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
