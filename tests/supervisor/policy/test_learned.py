"""Learned start-up windows: what the pure policy decides for the states the daemon produces."""

from __future__ import annotations

import pytest

from supervisor.config.fast import LearnedSettings
from supervisor.policy.learned import Learned, fingerprint, fold_quiet, learn, model_of, window_for

ON = LearnedSettings(multiple=5.0, floor_s=20.0)


def test_an_unknown_model_or_rung_keeps_the_configured_window() -> None:
    w = window_for(None, "allocating_kv", 180.0, ON)
    assert (w.window_s, w.source) == (180.0, "configured")
    assert "no good start" in w.why


def test_a_known_phase_gets_the_multiple_of_its_longest_quiet() -> None:
    known = Learned(starts=2, quiet_s={"capturing_graphs": 6.0})
    w = window_for(known, "capturing_graphs", 180.0, ON)
    assert (w.window_s, w.source, w.learned_quiet_s) == (30.0, "learned", 6.0)
    assert "5 x the longest quiet 6.0 s" in w.why


@pytest.mark.parametrize(
    "quiet,expected,source",
    [
        (0.5, 20.0, "floor"),  # 2.5 s would judge a hiccup: the floor holds
        (100.0, 180.0, "configured"),  # 500 s: never above the configured window (the ceiling)
    ],
)
def test_the_floor_and_the_ceiling_bound_the_window(quiet: float, expected: float, source: str) -> None:
    w = window_for(Learned(1, {"allocating_kv": quiet}), "allocating_kv", 180.0, ON)
    assert (w.window_s, w.source) == (expected, source)


def test_a_floor_above_the_configured_window_gives_the_configured_one() -> None:
    w = window_for(Learned(1, {"spawning": 0.1}), "spawning", 10.0, ON)
    assert w.window_s == 10.0


def test_a_phase_never_seen_on_a_good_start_keeps_the_configured_window() -> None:
    w = window_for(Learned(3, {"spawning": 2.0}), "loading_draft", 180.0, ON)
    assert w.source == "configured" and "never seen" in w.why


def test_off_and_min_starts() -> None:
    known = Learned(1, {"spawning": 2.0})
    assert window_for(known, "spawning", 180.0, LearnedSettings(enabled=False)).source == "off"
    w = window_for(known, "spawning", 180.0, LearnedSettings(min_starts=3))
    assert w.source == "configured" and "fewer than min_starts = 3" in w.why


def test_learning_keeps_the_longest_quiet_of_every_start() -> None:
    one = learn(None, {"spawning": 3.0, "capturing_graphs": 50.0})
    two = learn(one, {"spawning": 8.0, "capturing_graphs": 10.0, "warming_up": 1.0})
    assert two.starts == 2
    assert two.quiet_s == {"spawning": 8.0, "capturing_graphs": 50.0, "warming_up": 1.0}
    assert learn(two, {"spawning": float("nan")}).quiet_s["spawning"] == 8.0


def test_fold_quiet_keeps_the_longest_per_phase() -> None:
    longest = fold_quiet({}, "spawning", 1.0)
    longest = fold_quiet(longest, "spawning", 0.5)
    longest = fold_quiet(longest, "loading_weights", 2.0)
    assert longest == {"spawning": 1.0, "loading_weights": 2.0}


def test_the_fingerprint_ignores_where_the_server_listens_and_nothing_else() -> None:
    base = ["python3", "-m", "sglang.launch_server", "--model-path", "/m", "--tp-size", "8"]
    a = fingerprint([*base, "--host", "127.0.0.1", "--port", "30000"])
    b = fingerprint([*base, "--host", "0.0.0.0", "--port=31000"])
    assert a == b == fingerprint(base)
    assert fingerprint([*base, "--disable-cuda-graph"]) != a
    assert model_of(base) == "/m" and model_of(["x", "--model=/n"]) == "/n" and model_of(["x"]) == ""
