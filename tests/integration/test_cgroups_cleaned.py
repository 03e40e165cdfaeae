"""Every stop removes its launch cgroup: after failed launches, adopted servers and a state reset.

The attack found 12 empty `sglang-server-*` cgroups after state resets (each reset made a new random
marker, so the old cgroup's name was never looked for again); the test suite leaked more.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from daemonproc import cleanup, start, wait_status

from supervisor.config.render import dump_toml as to_toml
from supervisor.daemon.persist import marker_for
from supervisor.process.cgroup import PREFIX, CgroupRoot

pytestmark = pytest.mark.integration


def launch_cgroup(state_dir: Path) -> Path:
    root, why = CgroupRoot.find()
    if root is None:
        pytest.skip(f"no writable cgroup v2 here: {why}")
    return root.path / f"{PREFIX}{marker_for(state_dir)}"


async def test_failed_launches_leave_no_cgroup(daemon, sim) -> None:  # type: ignore[no-untyped-def]
    s = sim("ok", tp=1, restart={"max_restarts_per_hour": 3})
    cg = launch_cgroup(Path(s.paths.state_dir))
    server = s.server.model_copy(update={"command": (str(Path(s.paths.state_dir) / "no-such-program"),), "args": {}})
    s = s.model_copy(update={"server": server})
    r = await daemon(s)
    await r.wait_for(lambda x: x.state == "failed", 60, "failed after the launches that could not start")
    assert not cg.exists()
    await r.stop()
    assert not cg.exists()


@pytest.mark.parametrize("reset", [False, True])
def test_stops_of_adopted_servers_and_after_a_state_reset_remove_the_cgroup(sim, tmp_path: Path, reset: bool) -> None:  # type: ignore[no-untyped-def]
    s = sim("ok", tp=1)
    state_dir = Path(s.paths.state_dir)
    cg = launch_cgroup(state_dir)
    cfg = tmp_path / "c.toml"
    cfg.write_text(to_toml(s))
    api = f"http://127.0.0.1:{s.api.port}"
    proc = start(cfg, dict(os.environ))
    try:
        pid = wait_status(api, lambda x: x["state"] == "ready", 40, proc)["pid"]
        assert cg.is_dir() and pid in [int(x) for x in (cg / "cgroup.procs").read_text().split()]
        proc.kill()
        proc.wait(10)
        if reset:
            (state_dir / "state.json").unlink()
        proc = start(cfg, dict(os.environ))
        st = wait_status(api, lambda x: x["state"] == "ready", 40, proc)
        assert (st["pid"] == pid) != reset  # adopted, or (state lost) stopped by marker and relaunched
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
        assert not cg.exists(), "the stop removed the launch cgroup"
        siblings = [p.name for p in cg.parent.iterdir() if p.name.startswith(PREFIX) and "probe" not in p.name]
        assert cg.name not in siblings
    finally:
        cleanup(proc, str(state_dir))
