"""Issue 50 through the running daemon: state files written by someone else cannot hang its start or
turn its start-up watchdog off.

A FIFO named `launches.json` (or `state.json`) hung the daemon's start: it waited for a writer
forever. `NaN` written into `launches.json` made the learned stall window NaN, so a deadlock was
judged only by the `startup_timeout_s` backstop (122 s in the issue's run; 3,600 s as shipped).
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any

import pytest
from daemonproc import cleanup, start, wait_status

from supervisor.config.fast import LearnedSettings
from supervisor.config.render import dump_toml as to_toml
from supervisor.config.settings import Settings

pytestmark = pytest.mark.integration


def learned(s: Settings, **kw: Any) -> Settings:
    return s.model_copy(update={"learned": LearnedSettings(**kw)})


def test_fifos_named_launches_json_and_state_json_do_not_hang_the_start(sim, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    s = sim("ok", tp=1)
    state_dir = Path(s.paths.state_dir)
    state_dir.mkdir(parents=True, exist_ok=True)
    for name in ("launches.json", "state.json"):
        os.mkfifo(state_dir / name)
    cfg = tmp_path / "c.toml"
    cfg.write_text(to_toml(s))
    api = f"http://127.0.0.1:{s.api.port}"
    proc = start(cfg, dict(os.environ))
    try:
        wait_status(api, lambda st: st.get("state") == "ready", 120, proc)
    finally:
        cleanup(proc, str(state_dir))


def test_a_symlinked_launches_json_is_not_followed_and_said_in_the_journal(sim, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A real symlink named `launches.json` to a book someone else writes (here one that would make every
    phase's window 0.5 s): the daemon starts on the configured windows and its journal says why."""
    s = sim("ok", tp=1)
    state_dir = Path(s.paths.state_dir)
    state_dir.mkdir(parents=True, exist_ok=True)
    elsewhere = tmp_path / "someone-elses-book.json"
    elsewhere.write_text(json.dumps({"version": 1, "entries": {}}))
    (state_dir / "launches.json").symlink_to(elsewhere)
    cfg = tmp_path / "c.toml"
    cfg.write_text(to_toml(s))
    api = f"http://127.0.0.1:{s.api.port}"
    proc = start(cfg, dict(os.environ))
    try:
        wait_status(api, lambda st: st.get("state") == "ready", 120, proc)
        journal = (state_dir / "events.jsonl").read_text().splitlines()
        said = [json.loads(x) for x in journal if '"launch_book_unreadable"' in x]
        assert said and "symbolic link" in said[0]["error"], said
        # The book the good start wrote replaced the link (a rename over it); nothing went through it.
        wait_status(api, lambda st: not (state_dir / "launches.json").is_symlink(), 30, proc)
        assert json.loads(elsewhere.read_text()) == {"version": 1, "entries": {}}, "nothing written through it"
    finally:
        cleanup(proc, str(state_dir))


async def test_nan_in_launches_json_leaves_the_configured_stall_window_on(daemon, sim) -> None:  # type: ignore[no-untyped-def]
    configured = 20.0
    wd = {"startup_stall_s": configured, "cpu_only_stall_s": 60.0, "startup_timeout_s": 600.0}
    good = learned(sim("ok", watchdog=wd), floor_s=3.0, multiple=5.0, min_starts=1)
    r = await daemon(good)
    await r.wait_for(lambda x: x.state == "ready", 60, "ready")
    assert await r.stop() == 0
    book_path = Path(good.paths.state_dir) / "launches.json"
    book = json.loads(book_path.read_text())
    (entry,) = book["entries"].values()
    assert entry["quiet_s"], entry
    entry["quiet_s"] = {phase: float("nan") for phase in entry["quiet_s"]}  # what the attack wrote
    book_path.write_text(json.dumps(book))
    assert "NaN" in book_path.read_text()

    bad = learned(sim("deadlock_after_load", watchdog=wd), floor_s=3.0, multiple=5.0, min_starts=1)
    assert bad.paths.state_dir == good.paths.state_dir
    r2 = await daemon(bad)
    seen: list[Any] = []
    t0 = time.monotonic()

    def judged(x: Any) -> bool:
        if x.stall_window is not None:
            seen.append(x.stall_window)
        return x.state in ("hung", "diagnosing", "restarting")

    # Within the configured window (and the load before it), far before the 600 s backstop.
    await r2.wait_for(judged, configured + 60, "the stall verdict within the configured window")
    assert time.monotonic() - t0 < configured + 60
    assert seen and all(math.isfinite(w.window_s) and 0 < w.window_s <= configured for w in seen), seen
    assert all(w.source == "configured" for w in seen), seen  # the poisoned entry was dropped
    snap = await r2.wait_for(lambda x: x.last_incident is not None, 30, "the incident")
    assert snap.last_incident is not None and snap.last_incident.cause == "startup_stall"
    # The dropped entry is said in the journal (what `/events` shows), not only in the log.
    journal = (Path(bad.paths.state_dir) / "events.jsonl").read_text().splitlines()
    dropped = [json.loads(x) for x in journal if '"launch_book_unreadable"' in x]
    assert dropped, "no launch_book_unreadable record in the journal"
    assert "nan" in dropped[-1]["error"].lower(), dropped
