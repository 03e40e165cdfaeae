"""Kernel caches pinned per fingerprint, a crashed launch's writes set aside, the prune bound (real
directories and files)."""

from __future__ import annotations

import os
import time
from pathlib import Path

from supervisor.warmstart import kernelcache
from supervisor.warmstart.cacheplace import daemon_identity
from supervisor.warmstart.kernelcache import CACHE_VARS, MARKER, SET_ASIDE, USED, Home, mark_ready, prepare

GB = 1024**3


def home_of(tmp: Path, name: str = "state") -> Home:
    return Home(tmp / "cache", tmp / name)


def launch(  # type: ignore[no-untyped-def]
    home: Home, fp: str = "fp1", env: dict[str, str] | None = None, now: float | None = None, max_bytes: int = 50 * GB
):
    return prepare(home, fp, env or {}, pin=True, max_bytes=max_bytes, now_wall=now if now is not None else time.time())


def own(home: Home) -> Path:
    return home.cache_dir / f"daemon-{daemon_identity(home.state_dir)}"


def test_every_unset_cache_is_pinned_under_the_fingerprint_and_the_operators_are_left(tmp_path: Path) -> None:
    h = home_of(tmp_path)
    p = launch(h, env={"TRITON_CACHE_DIR": "/fast/triton"})
    assert "TRITON_CACHE_DIR" not in p.env and p.view.operator_set == ("TRITON_CACHE_DIR",)
    assert set(p.env) == {v for v, _ in CACHE_VARS} - {"TRITON_CACHE_DIR"}
    for path in p.env.values():
        assert Path(path).is_dir() and Path(path).parent == own(h) / "fp1"
    assert p.view.state == "miss" and (own(h) / "fp1" / MARKER).exists()
    assert (own(h) / "fp1" / "OWNER").read_text().strip() == daemon_identity(h.state_dir)
    assert p.view.refused is None and p.view.others == 0


def test_a_ready_launch_clears_its_marker_and_the_next_one_hits(tmp_path: Path) -> None:
    h = home_of(tmp_path)
    p = launch(h)
    (Path(p.env["TORCHINDUCTOR_CACHE_DIR"]) / "entry").write_bytes(b"x" * 1000)
    done = mark_ready(p.view, h)
    assert done.bytes_after == 1000 and not (own(h) / "fp1" / MARKER).exists()
    assert (own(h) / "fp1" / USED).exists()
    again = launch(h)
    assert again.view.state == "hit" and again.view.bytes_before == 1000 and again.view.set_aside is None
    assert kernelcache.existing(h, "fp1") == str(own(h) / "fp1") and kernelcache.existing(h, "fp2") is None


def test_what_a_crashed_launch_wrote_is_set_aside_and_what_was_complete_stays(tmp_path: Path) -> None:
    h = home_of(tmp_path)
    first = launch(h, now=time.time() - 3600)
    old = Path(first.env["TRITON_CACHE_DIR"]) / "complete.cubin"
    old.write_bytes(b"ok")
    os.utime(old, (time.time() - 3600, time.time() - 3600))
    mark_ready(first.view, h)
    crashed = launch(h)  # this launch dies mid-compile: no ready, the marker stays
    half = Path(crashed.env["TRITON_CACHE_DIR"]) / "half.cubin"
    half.write_bytes(b"half-writ")
    after = launch(h)
    assert after.view.state == "set_aside" and after.view.set_aside is not None
    moved = Path(after.view.set_aside)
    assert moved.parent == own(h) / SET_ASIDE
    assert (moved / "triton" / "half.cubin").read_bytes() == b"half-writ"  # kept, never deleted
    assert not half.exists() and old.read_bytes() == b"ok"


def test_a_crashed_launch_that_wrote_nothing_sets_nothing_aside(tmp_path: Path) -> None:
    h = home_of(tmp_path)
    launch(h)
    after = launch(h)
    assert after.view.state == "miss" and after.view.set_aside is None


def test_an_unreadable_marker_still_counts_as_a_crashed_launch(tmp_path: Path) -> None:
    h = home_of(tmp_path)
    p = launch(h)
    (Path(p.env["SGLANG_DG_CACHE_DIR"]) / "kernel.so").write_bytes(b"?")
    (own(h) / "fp1" / MARKER).write_text("{not json")
    assert launch(h).view.state == "set_aside"


def test_the_prune_removes_set_aside_then_least_recently_ready_never_the_launching_one(tmp_path: Path) -> None:
    h = home_of(tmp_path)
    for i, fp in enumerate(("old", "new")):
        p = launch(h, fp)
        (Path(p.env["TRITON_CACHE_DIR"]) / "k").write_bytes(b"x" * 4000)
        mark_ready(p.view, h)
        os.utime(own(h) / fp / USED, (1000.0 + i, 1000.0 + i))
    (own(h) / SET_ASIDE / "x-1").mkdir(parents=True)
    (own(h) / SET_ASIDE / "x-1" / "f").write_bytes(b"y" * 4000)
    (own(h) / "operator-notes").mkdir()  # not this module's: never touched
    got = launch(h, "new", max_bytes=5000)
    assert str(own(h) / SET_ASIDE / "x-1") in got.pruned and str(own(h) / "old") in got.pruned
    assert (own(h) / "new").is_dir() and (own(h) / "operator-notes").is_dir()
    assert any("operator-notes" in x for x in got.left_alone)
    assert launch(h, "new", max_bytes=5000).pruned == ()


def test_pin_off_leaves_every_cache_alone(tmp_path: Path) -> None:
    h = home_of(tmp_path)
    p = prepare(h, "fp", {}, pin=False, max_bytes=GB, now_wall=time.time())
    assert p.env == {} and p.view.state == "unpinned" and not any(tmp_path.iterdir())
