"""The one polling loop (supervisor.common.waiting): what it returns, when it gives up, what it says."""

from __future__ import annotations

import asyncio

import pytest

from supervisor.common.waiting import WaitTimeout, wait_for, wait_for_async


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.now += s


def test_returns_the_first_value_the_predicate_accepts_and_skips_none() -> None:
    values = iter([None, {"state": "starting"}, None, {"state": "ready"}])
    clock = Clock()
    got = wait_for(lambda: next(values), lambda st: st["state"] == "ready", 10, clock=clock, sleep=clock.sleep)
    assert got == {"state": "ready"} and clock.now == pytest.approx(0.3)


def test_times_out_naming_what_with_the_last_value_read() -> None:
    clock = Clock()
    with pytest.raises(WaitTimeout, match=r"no ready within 1 s; last state starting") as err:
        wait_for(
            lambda: {"state": "starting"}, lambda st: False, 1.0, what="ready",
            show=lambda st: f"state {st['state']}", clock=clock, sleep=clock.sleep,
        )  # fmt: skip
    assert err.value.last == {"state": "starting"} and isinstance(err.value, TimeoutError)
    assert 1.0 <= clock.now <= 1.1 + 1e-9  # read once more at the deadline, then gave up


def test_nothing_read_is_said_and_a_raising_read_gives_up_at_once() -> None:
    clock = Clock()
    with pytest.raises(WaitTimeout, match="last nothing read"):
        wait_for(lambda: None, timeout=0.5, clock=clock, sleep=clock.sleep)

    def exited() -> None:
        raise RuntimeError("the daemon exited")

    with pytest.raises(RuntimeError, match="exited"):
        wait_for(exited, timeout=5, clock=clock, sleep=clock.sleep)


def test_the_async_form_lets_the_loop_run_while_it_waits() -> None:
    async def main() -> int:
        box = [0]

        async def bump() -> None:
            await asyncio.sleep(0.02)
            box[0] = 7

        task = asyncio.create_task(bump())
        got = await wait_for_async(lambda: box[0] or None, timeout=5, interval=0.005)
        await task
        return got

    assert asyncio.run(main()) == 7
