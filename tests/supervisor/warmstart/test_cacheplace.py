"""Issue 50: a `cache_dir` another user can write cannot steer the daemon, and two daemons on one
`cache_dir` never touch each other's caches (real directories, real symlinks, real modes and owners;
"another user" is uid 65534, made with os.chown where the test runs as root)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from supervisor.warmstart import kernelcache
from supervisor.warmstart.cacheplace import Refused, daemon_identity, judge
from supervisor.warmstart.kernelcache import MARKER, SET_ASIDE, USED, Home, mark_ready, prepare

GB = 1024**3
NOBODY = 65534
EUID = os.geteuid()
as_root = pytest.mark.skipif(EUID != 0, reason="another user's directory needs chown (root, as on CI)")


def launch(home: Home, fp: str = "fp1", max_bytes: int = 50 * GB, now: float | None = None) -> kernelcache.Prepared:
    return prepare(home, fp, {}, pin=True, max_bytes=max_bytes, now_wall=now if now is not None else time.time())


def victim_of(tmp: Path) -> Path:
    """Another user's directory with files the daemon must never delete or write into."""
    v = tmp / "victim"
    v.mkdir()
    for i in range(3):
        (v / f"precious-{i}").mkdir()
        (v / f"precious-{i}" / "data").write_bytes(b"v" * 100)
    return v


def files_under(p: Path) -> set[str]:
    return {str(x.relative_to(p)) for x in p.rglob("*")}


@pytest.mark.parametrize(
    ("uid", "mode", "place"),
    [
        (EUID, 0o700, "own"),
        (EUID, 0o755, "own"),
        (EUID, 0o777, "refused"),  # anyone can rename or plant in it
        (EUID, 0o770, "refused"),
        (0, 0o1777, "private"),  # /tmp
        (EUID, 0o1777, "private"),
        (NOBODY, 0o1777, "refused"),  # its owner may rename what is in it
        (NOBODY, 0o700, "refused"),
    ],
)
def test_who_may_own_a_cache_dir(uid: int, mode: int, place: str) -> None:
    got, why = judge("/c", uid, mode, EUID if EUID != NOBODY else 1000)
    assert got == place, why
    assert (why == "") == (place == "own")


def test_a_world_writable_cache_dir_is_refused_and_nothing_is_written_in_it(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    cache.chmod(0o777)
    victim = victim_of(tmp_path)
    (cache / SET_ASIDE).symlink_to(victim)  # the planted links of the attack
    (cache / "fp1").symlink_to(victim)
    before = files_under(victim)
    for _ in range(2):  # a launch and a relaunch
        p = launch(Home(cache, tmp_path / "state"), max_bytes=0)
        assert p.env == {} and p.view.state == "unpinned"
        assert p.view.refused is not None and "writable by group or others" in p.view.refused
    assert files_under(victim) == before
    assert sorted(x.name for x in cache.iterdir()) == ["fp1", SET_ASIDE]  # left as planted


def test_a_sticky_shared_cache_dir_gets_a_private_directory_and_planted_links_are_never_followed(
    tmp_path: Path,
) -> None:
    cache = tmp_path / "shared"
    cache.mkdir()
    cache.chmod(0o1777)  # like /tmp
    victim = victim_of(tmp_path)
    (cache / SET_ASIDE).symlink_to(victim)
    (cache / "fp1").symlink_to(victim)
    h = Home(cache, tmp_path / "state")
    before = files_under(victim)
    first = launch(h, max_bytes=0)
    private = cache / f"uid-{EUID}"
    assert first.view.refused is None and first.view.dir.startswith(str(private) + "/")
    assert private.stat().st_mode & 0o777 == 0o700
    (Path(first.env["TRITON_CACHE_DIR"]) / "k").write_bytes(b"x" * 100)
    crashed = launch(h, max_bytes=0)  # the first died before ready: its writes set aside, pruned at 0
    assert crashed.view.state == "set_aside"
    mark_ready(crashed.view, h)
    launch(h, "fp2", max_bytes=0)
    assert files_under(victim) == before
    assert (cache / SET_ASIDE).is_symlink() and (cache / "fp1").is_symlink()


def test_a_planted_private_directory_link_is_left_alone(tmp_path: Path) -> None:
    cache = tmp_path / "shared"
    cache.mkdir()
    cache.chmod(0o1777)
    victim = victim_of(tmp_path)
    (cache / f"uid-{EUID}").symlink_to(victim)
    before = files_under(victim)
    p = launch(Home(cache, tmp_path / "state"))
    assert p.view.state == "unpinned" and p.view.refused is not None and "symbolic link" in p.view.refused
    assert files_under(victim) == before


@as_root
def test_a_private_directory_another_user_made_first_is_refused(tmp_path: Path) -> None:
    cache = tmp_path / "shared"
    cache.mkdir()
    cache.chmod(0o1777)
    squat = cache / f"uid-{EUID}"
    squat.mkdir(mode=0o700)
    os.chown(squat, NOBODY, NOBODY)
    p = launch(Home(cache, tmp_path / "state"))
    assert p.view.state == "unpinned" and "not this daemon's private directory" in (p.view.refused or "")
    assert list(squat.iterdir()) == []


@as_root
def test_a_cache_dir_of_another_user_is_refused(tmp_path: Path) -> None:
    cache = tmp_path / "theirs"
    cache.mkdir(mode=0o755)
    os.chown(cache, NOBODY, NOBODY)
    p = launch(Home(cache, tmp_path / "state"))
    assert p.view.state == "unpinned" and f"owned by uid {NOBODY}" in (p.view.refused or "")
    assert list(cache.iterdir()) == []


@as_root
def test_a_directory_on_the_way_that_another_user_owns_is_refused(tmp_path: Path) -> None:
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o755)
    os.chown(theirs, NOBODY, NOBODY)  # they could swap `cache` for a link at any time
    (theirs / "cache").mkdir(mode=0o700)
    p = launch(Home(theirs / "cache", tmp_path / "state"))
    assert p.view.state == "unpinned" and "on its way" in (p.view.refused or "")


def test_a_writable_directory_on_the_way_is_refused(tmp_path: Path) -> None:
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    open_dir.chmod(0o777)
    p = launch(Home(open_dir / "cache", tmp_path / "state"))
    assert p.view.state == "unpinned" and "on its way" in (p.view.refused or "")
    assert not (open_dir / "cache").exists()


def test_links_inside_the_daemons_own_directory_are_left_alone_and_reported(tmp_path: Path) -> None:
    h = Home(tmp_path / "cache", tmp_path / "state")
    first = launch(h)
    own = Path(first.view.dir).parent
    victim = victim_of(tmp_path)
    before = files_under(victim)
    (own / SET_ASIDE).symlink_to(victim)
    (own / "fp2").symlink_to(victim)
    got = launch(h, max_bytes=0)
    assert got.view.refused is None
    assert any(SET_ASIDE in x and "symbolic link" in x for x in got.left_alone)
    assert any("fp2" in x and "symbolic link" in x for x in got.left_alone)
    bad = launch(h, "fp2")  # the fingerprint about to launch is a link: not pinned, not written through
    assert bad.view.state == "unpinned" and "symbolic link" in (bad.view.refused or "")
    assert files_under(victim) == before


def test_two_daemons_on_one_cache_dir_never_touch_each_others_fingerprints(tmp_path: Path) -> None:
    a = Home(tmp_path / "cache", tmp_path / "state-a")
    b = Home(tmp_path / "cache", tmp_path / "state-b")
    assert daemon_identity(a.state_dir) != daemon_identity(b.state_dir)
    pa = launch(a, "same")  # both launch the same model and rung: the same fingerprint
    pb = launch(b, "same")
    assert pa.view.dir != pb.view.dir
    (Path(pa.env["TRITON_CACHE_DIR"]) / "a.cubin").write_bytes(b"a" * 1000)
    (Path(pb.env["TRITON_CACHE_DIR"]) / "b.cubin").write_bytes(b"b" * 1000)
    mark_ready(pa.view, a)  # b's launch never reaches ready: its marker stays
    for fp in ("old1", "old2"):
        mark_ready(launch(b, fp).view, b)
    again = launch(a, "other", max_bytes=0)  # a prunes everything of its own it may
    assert str(Path(pa.view.dir)) in again.pruned
    assert all(str(Path(pb.view.dir).parent) not in x for x in again.pruned)
    assert again.view.others == 3 and again.view.others_bytes >= 1000  # b's fingerprints, counted
    assert (Path(pb.env["TRITON_CACHE_DIR"]) / "b.cubin").exists()
    relaunch = launch(b, "same", max_bytes=0)  # b's crashed launch is set aside in b's own directory
    assert relaunch.view.state == "set_aside" and relaunch.view.set_aside is not None
    assert relaunch.view.set_aside.startswith(str(Path(pb.view.dir).parent) + "/")
    assert (Path(again.view.dir)).is_dir()  # a's launching fingerprint, untouched by b's prune


def test_a_fingerprint_with_another_daemons_owner_marker_is_never_pruned(tmp_path: Path) -> None:
    h = Home(tmp_path / "cache", tmp_path / "state")
    mark_ready(launch(h, "mine").view, h)
    foreign = Path(launch(h, "theirs").view.dir)
    mark_ready(launch(h, "theirs").view, h)
    (foreign / "OWNER").write_text("0123456789abcdef\n")  # a marker that names another daemon
    (foreign / "triton" / "k").write_bytes(b"k" * 100)
    got = launch(h, "new", max_bytes=0)
    assert str(foreign) not in got.pruned and (foreign / "triton" / "k").exists()
    assert any("theirs" in x and "owner marker" in x for x in got.left_alone)
    assert str(Path(got.view.dir).parent / "mine") in got.pruned


def test_the_identity_is_written_once_and_never_read_through_a_link(tmp_path: Path) -> None:
    state = tmp_path / "state"
    first = daemon_identity(state)
    assert daemon_identity(state) == first and (state / "identity").read_text().strip() == first
    other = tmp_path / "other"
    other.mkdir()
    (other / "identity").symlink_to(state / "identity")
    with pytest.raises(Refused, match="link"):
        daemon_identity(other)
    (other / "identity").unlink()
    (other / "identity").write_text("not an id")
    with pytest.raises(Refused, match="16 hex digits"):
        daemon_identity(other)
    p = launch(Home(tmp_path / "cache", other))
    assert p.view.state == "unpinned" and "16 hex digits" in (p.view.refused or "")


def test_caches_of_the_layout_before_issue_50_are_adopted_only_from_the_default_cache_dir(tmp_path: Path) -> None:
    cache = tmp_path / "state" / "cache"
    legacy = cache / "oldfp"
    (legacy / "triton").mkdir(parents=True)
    (legacy / "triton" / "k").write_bytes(b"k" * 10)
    (legacy / USED).write_text("1")
    (cache / SET_ASIDE / "oldfp-20260101T000000").mkdir(parents=True)
    explicit = launch(Home(cache, tmp_path / "state"))  # a named cache_dir: maybe another daemon's
    assert legacy.is_dir() and explicit.view.others == 1 and explicit.adopted == ()
    h = Home(cache, tmp_path / "state", adopt_legacy=True)
    got = launch(h, "oldfp")
    assert set(got.adopted) == {"oldfp", f"{SET_ASIDE}/oldfp-20260101T000000"}
    assert not legacy.exists() and not (cache / SET_ASIDE).exists()
    assert got.view.state == "hit" and got.view.others == 0
    assert (Path(got.view.dir) / "triton" / "k").exists() and (Path(got.view.dir) / MARKER).exists()


def test_check_config_says_what_run_will_make_of_the_cache_dir(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from supervisor.cli import main

    cache = tmp_path / "c"
    cache.mkdir()
    cfg = tmp_path / "c.toml"
    cfg.write_text(
        f'[server]\ncommand = ["/bin/true"]\n[paths]\nstate_dir = "{tmp_path / "state"}"\ncache_dir = "{cache}"\n'
    )
    assert main(["check-config", "--config", str(cfg), "--no-sglang"]) == 0
    assert "cache_dir" not in capsys.readouterr().out
    cache.chmod(0o777)
    main(["check-config", "--config", str(cfg), "--no-sglang", "--strict"])
    out = capsys.readouterr().out
    assert "warning: paths.cache_dir:" in out and "writable by group or others" in out and "unpinned" in out
    cache.chmod(0o1777)
    main(["check-config", "--config", str(cfg), "--no-sglang"])
    assert f"the caches go to uid-{EUID}/" in capsys.readouterr().out
    assert list(cache.iterdir()) == []  # the check creates nothing
