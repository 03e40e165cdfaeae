"""Hostile neighbours of the kernel caches (issue 50), rows of bench/hostile.py.

  cache_symlink  a `cache_dir` everyone can write (mode 1777, like /tmp) in which another user
                 planted `set-aside` and the daemon's fingerprint directory as links to a victim's
                 directories; the daemon launches, relaunches (twice, onto another rung and back) and
                 prunes with `[caches] max_gb` about 1 KB: `victim_deleted` (the victim's files the
                 daemon deleted) and `written_outside` (files and directories it made outside
                 `cache_dir` and its state directory, the victim's included) must be 0
  shared_cache   two daemons (same model and rungs: the same fingerprints) on one `cache_dir`, each
                 launching, relaunching onto another rung and back, prune bound about 1 KB:
                 `theirs_deleted` (files of the other daemon's fingerprints that went) must be 0

Before the fix: a planted `set-aside` link made the prune delete three foreign directories, a linked
fingerprint directory made the daemon write its marker and eight cache directories into another
user's place, and two daemons on one `cache_dir` pruned and set aside each other's live caches.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

CACHE_ATTACKS = ("cache_symlink", "shared_cache")
NOBODY = 65534  # "another user": the victim's files are chowned to it when the benchmark runs as root
INTRO = (
    " The two cache rows (bench/hostile_caches.py, issue 50) attack `[paths] cache_dir` instead of the "
    "API: `cache_symlink` plants `set-aside` and the fingerprint's directory as links to another user's "
    "directories in a cache_dir of mode 1777 and lets the daemon launch, relaunch twice and prune to about "
    "1 KB (`victim_deleted` and `written_outside` must be 0); `shared_cache` runs two daemons on one "
    "cache_dir with the same fingerprints, each relaunching twice under the same prune bound "
    "(`theirs_deleted` must be 0). Before the fix the planted link made the prune delete three foreign "
    "directories, and the two daemons pruned each other's live caches."
)


def _files(root: Path, skip: tuple[Path, ...] = (), *, dirs_too: bool = False) -> set[str]:
    out: set[str] = set()
    for base, dirs, files in os.walk(root):
        if any(Path(base) == s or Path(base).is_relative_to(s) for s in skip):
            dirs[:] = []
            continue
        out.update(str(Path(base) / f) for f in (*files, *(dirs if dirs_too else ())))
    return out - {str(s) for s in skip}


def _settings(wd: Path, cache: Path, state: str = "state") -> Any:
    from bench.common import sim_settings
    from supervisor.config.settings import settings_from_mapping

    s = sim_settings(wd, "ok", tp=1, fallback=[{"name": "second", "args": {"disable-custom-all-reduce": True}}])
    data = json.loads(s.model_dump_json())
    data["paths"] = {**data["paths"], "cache_dir": str(cache), "state_dir": str(wd / state)}
    data["caches"] = {**data["caches"], "max_gb": 1e-6}
    return settings_from_mapping(data)


def _relaunch(d: Any, rung: str, incidents: int) -> dict[str, Any]:
    r = httpx.post(f"{d.api}/restart", json={"rung": rung, "reason": "hostile"}, timeout=10, trust_env=False)
    r.raise_for_status()
    st: dict[str, Any] = d.wait(
        lambda s: s.get("state") == "ready" and s.get("rung") == rung and s.get("incidents", 0) >= incidents,
        120,
        f"ready on {rung}",
    )
    return st


def _cache(st: dict[str, Any]) -> dict[str, Any]:
    return dict((st.get("launch_timeline") or {}).get("cache") or {})


def _pruned(d: Any) -> list[str]:
    return [str(x) for e in d.events() if e.get("event") == "kernel_cache" for x in e.get("removed") or ()]


def cache_symlink(seconds: float, watch: Callable[[str, int], Any]) -> dict[str, Any]:
    from bench.common import Daemon, workdir
    from supervisor.config.render import render_rung
    from supervisor.policy.learned import fingerprint

    wd = workdir("hostile-cache_symlink")
    cache = wd / "cache"
    cache.mkdir()
    cache.chmod(0o1777)
    victims = wd / "victim"
    for name in ("aside", "fp"):
        for i in range(3):
            p = victims / name / f"precious-{i}"
            p.mkdir(parents=True)
            (p / "data").write_bytes(b"v" * 4096)
    if os.geteuid() == 0:
        for base, dirs, files in os.walk(victims):
            for n in (*dirs, *files):
                os.chown(Path(base) / n, NOBODY, NOBODY)
        os.chown(victims, NOBODY, NOBODY)
    settings = _settings(wd, cache)
    fp = fingerprint(render_rung(settings.server, settings.ladder[0]).argv)
    (cache / "set-aside").symlink_to(victims / "aside")
    (cache / fp).symlink_to(victims / "fp")
    before_victim = _files(victims)
    outside_before = _files(wd, (cache, wd / "state"), dirs_too=True)
    d = Daemon(settings, wd)
    with d:
        st0 = d.wait(lambda s: s.get("state") == "ready" and bool(_cache(s)), 120, "ready")
        with watch(d.api, d.pid) as rest:
            time.sleep(3)
        with watch(d.api, d.pid) as w:
            t0 = time.monotonic()
            st1 = _relaunch(d, "second", 1)
            st2 = _relaunch(d, "base", 2)
            time.sleep(max(0.0, seconds - (time.monotonic() - t0)))
        with watch(d.api, d.pid) as after_w:
            time.sleep(3)
        pruned = _pruned(d)
    victim_now = _files(victims)
    outside_now = _files(wd, (cache, wd / "state"), dirs_too=True)
    written = (outside_now - outside_before) - {str(wd / "daemon.log"), str(wd / "config.toml")}
    extra = {
        "victim_deleted": len(before_victim - victim_now),
        "written_outside": len(written),  # files and directories, the victim's included
        "planted_fp_is_launchs": "yes" if st0.get("launch_timeline", {}).get("fingerprint") == fp else "no",
        "pinned_in": Path(_cache(st2).get("dir", "")).parent.parent.name or "unpinned",
        "pruned": len(pruned),
        "links_left": sum(1 for p in (cache / "set-aside", cache / fp) if p.is_symlink()),
    }
    return {
        "attack": "cache_symlink",
        "rest": rest.summary(),
        "attack_figures": w.summary(),
        "after": after_w.summary(),
        "extra": extra,
        "state_after": st2.get("state"),
        "caches": [_cache(st0), _cache(st1), _cache(st2)],
    }


def shared_cache(seconds: float, watch: Callable[[str, int], Any]) -> dict[str, Any]:
    from bench.common import Daemon, workdir

    wd = workdir("hostile-shared_cache")
    cache = wd / "cache"
    cache.mkdir(mode=0o700)
    for name in ("a", "b"):
        (wd / name).mkdir()
    a, b = (Daemon(_settings(wd, cache, f"state-{name}"), wd / name) for name in ("a", "b"))
    try:
        a.start()
        b.start()
        firsts = [x.wait(lambda s: s.get("state") == "ready" and bool(_cache(s)), 120, "ready") for x in (a, b)]
        roots = [Path(_cache(st)["dir"]).parent for st in firsts]
        with watch(a.api, a.pid) as rest:
            time.sleep(3)
        theirs_deleted = 0
        others_seen: list[int] = []
        with watch(a.api, a.pid) as w:
            t0 = time.monotonic()
            for n, rung in enumerate(("second", "base"), start=1):
                for me, d in enumerate((a, b)):
                    them = roots[1 - me]
                    held = _files(them, (them / "set-aside",))
                    st = _relaunch(d, rung, n)
                    others_seen.append(int(_cache(st).get("others", 0)))
                    theirs_deleted += len(held - _files(them, (them / "set-aside",)))
            time.sleep(max(0.0, seconds - (time.monotonic() - t0)))
        with watch(a.api, a.pid) as after_w:
            time.sleep(3)
        pruned = [_pruned(d) for d in (a, b)]
        state_after = (a.status() or {}).get("state")
    finally:
        b.stop()
        a.stop()
    crossed = sum(1 for me in (0, 1) for x in pruned[me] if x.startswith(str(roots[1 - me])))
    extra = {
        "theirs_deleted": theirs_deleted,
        "pruned_theirs": crossed,
        "pruned_own": sum(len(p) for p in pruned) - crossed,
        "same_fingerprint": "yes" if len({Path(_cache(st)["dir"]).name for st in firsts}) == 1 else "no",
        "others_counted": f"{min(others_seen)}-{max(others_seen)}",
    }
    return {
        "attack": "shared_cache",
        "rest": rest.summary(),
        "attack_figures": w.summary(),
        "after": after_w.summary(),
        "extra": extra,
        "state_after": state_after,
    }


def run_cache_attack(name: str, seconds: float, watch: Callable[[str, int], Any]) -> dict[str, Any]:
    """`name` against real daemons for about `seconds` (at least its relaunches), with the hostile
    benchmark's figures at rest, under attack and after (on the first daemon)."""
    if name == "cache_symlink":
        return cache_symlink(seconds, watch)
    if name == "shared_cache":
        return shared_cache(seconds, watch)
    raise ValueError(name)
