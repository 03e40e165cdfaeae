"""`check-config` on the server port: another live sglang-supervisor daemon's tree holds it, or
another live daemon is configured with it. `run` would refuse to launch onto such a tree (it is
never stopped: supervisor.process.owners), so the check says so first, naming the daemon."""

from __future__ import annotations

from typing import Literal

from supervisor.config.settings import Settings

Found = tuple[Literal["error", "warning"], str, str]  # level, key, message (check.Finding's fields)


def port_findings(settings: Settings) -> list[Found]:
    from supervisor.process.leftovers import port_owners
    from supervisor.process.owners import live_daemons, marker_of

    port, mine = settings.server.port, str(settings.state_dir.resolve())
    owners = port_owners(port, (marker_of(mine),))
    found: list[Found] = []
    for o in owners:
        if o.kind == "live":
            why = f"port {port} is held by the server of {o.describe()}: `run` would refuse to launch"
            found.append(("error", "server.port", f"{why} (give this config its own [server] port)"))
        elif o.kind == "unknown":
            why = f"port {port} is held by {o.describe()}: `run` would not stop it and would refuse to launch"
            found.append(("warning", "server.port", why))
    named = {o.pid for o in owners if o.kind == "live"}
    for d in live_daemons():
        if d.get("server_port") != port or d.get("state_dir") == mine or d.get("pid") in named:
            continue
        cfg = f", config {d['config']}" if d.get("config") else ""
        who = f"another sglang-supervisor daemon (pid {d['pid']}, state_dir {d['state_dir']}{cfg})"
        found.append(
            ("error", "server.port", f"{who} is configured with server port {port}: two daemons cannot share "
             "one server port (give this config its own [server] port)")
        )  # fmt: skip
    return found
