"""The RAS poller (issue 35): it never makes the daemon's poll wait, even on a RAS service that
accepts and never answers, asks at its interval, and asks far less often where nothing listens."""

from __future__ import annotations

import socket
import time

import pytest
from fake_ras import FakeRas, comm, report

from probes.ras import RasProbe, RasReport


def until(probe: RasProbe, clock: list[float], step: float = 0.0, deadline_s: float = 30.0) -> RasReport:
    """Poll as the daemon does until a report comes back (the fake clock advances `step` a poll)."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        got = probe.observe(clock[0])
        if got is not None:
            return got
        clock[0] += step
        time.sleep(0.02)
    raise AssertionError("no RAS report came back")


@pytest.mark.integration  # waits out the query's timeout
def test_a_service_that_never_answers_does_not_hold_the_poll() -> None:
    ras = FakeRas(lambda: report([]), mode="hang")  # accepts, then says nothing for 30 s
    try:
        probe = RasProbe(ras.address, interval_s=0.5, timeout_s=1.0)
        # Each observe returns at once while the query waits on its own thread: a poll that blocked
        # here would sit in the fake's 30 s silence and not reach the next line before the timeout.
        for _ in range(5):
            assert probe.observe(0.0) is None
        assert probe.queries == 1  # one query under way, not one per poll
        got = until(probe, [0.0])
        assert got.status == "timeout" and "within 1.0 s" in got.reason, got
    finally:
        ras.close()


def test_reports_come_at_the_interval() -> None:
    ras = FakeRas(lambda: report([comm([101, 102], counts=[8, 7])]))
    try:
        probe = RasProbe(ras.address, interval_s=2.0)
        clock = [0.0]
        first = until(probe, clock)
        assert first.status == "ok" and first.communicators[0].ranks[1].counts  # parsed, per rank
        assert probe.observe(clock[0] + 1.0) is None and probe.queries == 1  # not due yet
        probe.observe(clock[0] + 2.0)
        assert probe.queries == 2
    finally:
        ras.close()


def test_where_nothing_listens_it_asks_every_absent_interval() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    probe = RasProbe(f"127.0.0.1:{port}", interval_s=1.0, absent_interval_s=10.0)
    clock = [0.0]
    assert until(probe, clock).status == "absent"
    probe.observe(5.0)
    assert probe.queries == 1  # an absent service is not asked again at the 1 s interval
    probe.observe(10.0)
    assert probe.queries == 2
