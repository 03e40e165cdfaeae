"""Issue 50: refused page logins are throttled per address (and in total) and journalled once per
address per interval with a count (api/loginguard.py), on a fake clock."""

from __future__ import annotations

from api.loginguard import LoginGuard, Refusal


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_an_address_gets_its_burst_then_one_try_per_refill() -> None:
    clock = Clock()
    guard = LoginGuard(burst=3, per_minute=6.0, total_burst=100, total_per_minute=600.0, clock=clock)
    assert [guard.admit("a") for _ in range(3)] == [0.0, 0.0, 0.0]
    wait = guard.admit("a")
    assert 9.9 < wait <= 10.0  # 6 a minute: one every 10 s
    assert guard.admit("b") == 0.0  # another address has its own bucket
    clock.now += 10.0
    assert guard.admit("a") == 0.0
    assert guard.admit("a") > 0.0
    assert guard.throttled == 2


def test_all_addresses_together_have_a_budget_and_an_address_refused_for_it_keeps_its_try() -> None:
    clock = Clock()
    guard = LoginGuard(burst=5, per_minute=60.0, total_burst=4, total_per_minute=60.0, clock=clock)
    assert [guard.admit(f"10.0.0.{i}") for i in range(4)] == [0.0] * 4
    assert guard.admit("10.0.0.9") > 0.0  # the total is spent, not 10.0.0.9's own bucket
    clock.now += 1.0
    assert guard.admit("10.0.0.9") == 0.0


def test_refusals_are_one_record_per_address_per_interval_with_their_count() -> None:
    clock = Clock()
    guard = LoginGuard(interval_s=60.0, clock=clock)
    assert guard.refused("a", throttled=False) == Refusal("a", 1, 0)  # the first is journalled at once
    assert [guard.refused("a", throttled=t) for t in (False, True, True)] == [None, None, None]
    assert guard.refused("b", throttled=False) == Refusal("b", 1, 0)
    clock.now += 60.0
    assert guard.refused("a", throttled=True) == Refusal("a", 4, 3)  # the three held, and this one
    assert guard.refused("a", throttled=False) is None
    assert guard.flush("a") == Refusal("a", 1, 0) and guard.flush("a") is None
    clock.now -= 3600.0  # a clock that went back does not hold records for an hour
    assert guard.refused("a", throttled=False) == Refusal("a", 1, 0)


def test_a_flood_from_many_addresses_is_bounded_in_memory() -> None:
    guard = LoginGuard(max_addresses=100, clock=Clock())
    for i in range(10_000):
        guard.admit(f"a{i}")
        guard.refused(f"a{i}", throttled=False)
    assert len(guard._addresses) == 100
