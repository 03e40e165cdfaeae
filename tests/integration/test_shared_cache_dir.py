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


def environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(x.decode(errors="replace").split("=", 1) for x in raw if b"=" in x)


@pytest.mark.parametrize("mode", [0o777, 0o1777])
def test_a_cache_dir_others_can_write_never_steers_the_daemon(sim, tmp_path: Path, mode: int) -> None:  # type: ignore[no-untyped-def]
    """The issue's attack: links planted in a `cache_dir` anyone can write. World-writable without the
    sticky bit: the caches are refused and the server launches unpinned; sticky (a /tmp): the daemon
    keeps its caches in a private `uid-<euid>/`. Either way the victim's files stay as they were."""
    cache = tmp_path / "open-cache"
    cache.mkdir()
    cache.chmod(mode)
    victim = tmp_path / "victim"
    for i in range(3):
        (victim / f"precious-{i}").mkdir(parents=True)
        (victim / f"precious-{i}" / "data").write_bytes(b"v" * 100)
    before = {str(p) for p in victim.rglob("*")}
    (cache / "set-aside").symlink_to(victim)
    s: Settings = sim("ok", tp=1)
    data = json.loads(s.model_dump_json())
    data["paths"]["cache_dir"] = str(cache)
    data["caches"] = {**data["caches"], "max_gb": 1e-6}
    s = settings_from_mapping(data)
    cfg = tmp_path / "c.toml"
    cfg.write_text(to_toml(s))
    api = f"http://127.0.0.1:{s.api.port}"
    proc = start(cfg, dict(os.environ))
    try:
        st = ready_on(api, "base", proc)
        restart(api, "base")  # a relaunch: its prune runs
        st = ready_on(api, "base", proc, 1)
        said = [e for e in named(s.paths.state_dir, "kernel_cache") if e.get("state") in ("unpinned", "private")]
        env = environ(st["pid"])
        c = cache_of(st)
        if mode == 0o777:
            assert c["state"] == "unpinned" and "writable by group or others" in c["refused"]
            assert said and all("writable by group or others" in e["reason"] for e in said)
            assert len(said) == 3  # once at the start, then at each launch
            assert "TRITON_CACHE_DIR" not in env
        else:
            private = cache / f"uid-{os.geteuid()}"
            assert c["refused"] is None and c["dir"].startswith(str(private) + "/")
            assert env["TRITON_CACHE_DIR"].startswith(str(private) + "/")
            assert [e["state"] for e in said] == ["private"]  # said once, at the start
        assert {str(p) for p in victim.rglob("*")} == before
        assert (cache / "set-aside").is_symlink()
    finally:
        proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(30)
        cleanup(proc, s.paths.state_dir)
