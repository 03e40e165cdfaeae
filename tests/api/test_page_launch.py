"""The page's "Launch and outage" section: milestones beside the last good launch, the comparison,
the kernel cache, the stall window in force and the outage in its parts, escaped."""

from __future__ import annotations

from fake_supervisor import sample_snapshot

from api.pagehtml import PageData, render
from supervisor.status.launchviews import CacheView, LaunchTimelineView, MilestoneView, OutageView, StallWindowView


def test_the_section_shows_the_launch_against_the_last_good_one_and_the_outage() -> None:
    tl = LaunchTimelineView(
        rung="base",
        model="/m",
        fingerprint="abc",
        milestones=(
            MilestoneView(name="spawn", at_s=0.0, phase_s=60.0),
            MilestoneView(name="warmup", at_s=60.0, phase_s=119.0),
            MilestoneView(name="ready", at_s=179.0),
        ),
        last_good=(
            MilestoneView(name="spawn", at_s=0.0, phase_s=58.0),
            MilestoneView(name="warmup", at_s=58.0, phase_s=2.0),
        ),
        compared=("warmup took 119.0 s, the last good start 2.0 s",),
        cache=CacheView(dir="/c/abc", state="set_aside", bytes_before=10, set_aside="/c/set-aside/<abc>"),
    )
    out = OutageView(
        incident="i", cause="startup_stall", total_s=200.0, parts={"detection": 20.0, "relaunch": 180.0}, daemon_s=3.2
    )
    snap = sample_snapshot(state="ready").model_copy(update={"launch_timeline": tl, "last_outage": out})
    text = render(PageData(snapshot=snap, bundles=(), log_lines=(), timeline=()))
    assert "<h2>Launch and outage</h2>" in text
    assert "<tr><td>warmup</td><td>60.0</td><td>119.0 s</td><td>2.0 s</td></tr>" in text
    assert "warmup took 119.0 s, the last good start 2.0 s" in text
    assert "kernel cache set_aside" in text and "&lt;abc&gt;" in text and "<abc>" not in text
    assert "last outage (startup_stall) 200.0 s: detection 20.0 s, relaunch 180.0 s; the daemon's share 3.2 s" in text


def test_a_starting_server_shows_the_window_in_force_and_an_outage_under_way() -> None:
    w = StallWindowView(phase="capturing_graphs", window_s=30.0, source="learned", why="5 x 6.0 s", configured_s=180.0)
    o = OutageView(cause="serving_stall", parts={"detection": 10.0})
    snap = sample_snapshot(state="starting").model_copy(update={"stall_window": w, "outage": o})
    text = render(PageData(snapshot=snap, bundles=(), log_lines=(), timeline=()))
    assert "stall window 30 s in capturing_graphs (learned: 5 x 6.0 s)" in text
    assert "outage under way (serving_stall)" in text and "no launch yet" in text
