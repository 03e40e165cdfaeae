"""Issue 50 as an operator meets it: two daemons (`python -m supervisor run`, the simulator) whose
configs name one `[paths] cache_dir`, both on the same model and rungs (the same fingerprints), each
launching, relaunching onto another rung and back with a prune bound that removes everything it may:
neither ever sets aside, prunes or writes into the other's caches, and each counts the other's."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest
from daemonproc import cleanup, start, wait_status
from freeport import free_port
from statedir import named

from supervisor.config.render import dump_toml as to_toml
from supervisor.config.settings import Settings, settings_from_mapping

pytestmark = pytest.mark.integration


def entries(d: Path) -> set[str]:
    """The files under a fingerprint's directory (its compiled kernels and the daemon's markers)."""
    return {str(p.relative_to(d)) for p in d.rglob("*") if p.is_file()}


def cache_of(st: dict[str, Any]) -> dict[str, Any]:
    return st["launch_timeline"]["cache"]  # type: ignore[no-any-return]


def ready_on(api: str, rung: str, proc: subprocess.Popen[bytes], after: int = 0) -> dict[str, Any]:
    def ok(x: dict[str, Any]) -> bool:
        tl = x.get("launch_timeline") or {}
        serving = x["state"] == "ready" and x.get("rung") == rung and x["incidents"] >= after
        return serving and tl.get("cache") is not None

    return wait_status(api, ok, 60, proc)


def restart(api: str, rung: str) -> None:
    r = httpx.post(f"{api}/restart", json={"rung": rung, "reason": "test"}, timeout=10)
    assert r.status_code == 202, r.text


def test_two_daemons_on_one_cache_dir_never_touch_each_others_caches(sim, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    cache = tmp_path / "shared-cache"
    cache.mkdir(mode=0o700)
    base: Settings = sim("ok", tp=1, fallback=[{"name": "second", "args": {"disable-custom-all-reduce": True}}])
    data = json.loads(base.model_dump_json())
    data["paths"]["cache_dir"] = str(cache)
    data["caches"] = {**data["caches"], "max_gb": 1e-6}  # about 1 KB: every prune removes all it may
    procs: list[subprocess.Popen[bytes]] = []
    apis: list[str] = []
    states: list[str] = []
    for name in ("a", "b"):
        d = {**data, "paths": {**data["paths"], "state_dir": str(tmp_path / f"state-{name}")}}
        d["server"] = {**d["server"], "port": free_port()}
        d["api"] = {**d["api"], "port": free_port()}
        s = settings_from_mapping(d)
        cfg = tmp_path / f"{name}.toml"
        cfg.write_text(to_toml(s))
        procs.append(start(cfg, dict(os.environ)))
        apis.append(f"http://127.0.0.1:{s.api.port}")
        states.append(s.paths.state_dir)
    try:
        first = [ready_on(api, "base", p) for api, p in zip(apis, procs, strict=True)]
        fps = {st["launch_timeline"]["fingerprint"] for st in first}
        assert len(fps) == 1  # the same model and rung: the same fingerprint
        dirs = [Path(cache_of(st)["dir"]) for st in first]
        assert dirs[0] != dirs[1] and dirs[0].parent.parent == dirs[1].parent.parent == cache
        for d in dirs:
            assert any((d / "torchinductor" / "fxgraph").iterdir())  # each compiled into its own

        seen: dict[Path, set[str]] = {}

        def other_intact(me: int) -> None:
            """The other daemon's fingerprints: still there, every file of them."""
            them = Path(cache_of(first[1 - me])["dir"]).parent
            for fp in [p for p in them.iterdir() if p.is_dir() and p.name != "set-aside"]:
                now = entries(fp)
                assert seen.get(fp, set()) <= now, (fp, seen.get(fp, set()) - now)
                seen[fp] = now

        other_intact(0)
        other_intact(1)
        restarts = [0, 0]
        # Each in turn: onto the second rung (its base fingerprint pruned), then back (the second's pruned).
        for rung in ("second", "base"):
            for me in (0, 1):
                restart(apis[me], rung)
                restarts[me] += 1
                st = ready_on(apis[me], rung, procs[me], restarts[me])
                c = cache_of(st)
                assert c["refused"] is None and Path(c["dir"]).parent == dirs[me].parent
                assert c["others"] >= 1 and c["others_bytes"] > 0  # the other's, counted, not touched
                other_intact(me)
        for me in (0, 1):
            pruned = [e for e in named(states[me], "kernel_cache") if e.get("state") == "pruned"]
            assert pruned, f"daemon {me} never pruned: the test proves nothing"
            theirs = str(dirs[1 - me].parent)
            assert all(not str(x).startswith(theirs) for e in pruned for x in e["removed"]), pruned
            assert all(str(x).startswith(str(dirs[me].parent)) for e in pruned for x in e["removed"]), pruned
        assert sorted(p.name for p in cache.iterdir()) == sorted(d.parent.name for d in dirs)
    finally:
        for p, s in zip(procs, states, strict=True):
            p.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(30)
            cleanup(p, s)
