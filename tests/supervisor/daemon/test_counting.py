"""server.RestartingCount: one monotonic count from a reading that restarts (write_errors.server_log)."""

from __future__ import annotations

from supervisor.daemon.server import RestartingCount


def test_a_count_that_restarts_at_zero_feeds_a_monotonic_total() -> None:
    c = RestartingCount()
    # keeper 1 reaches 490; keeper 2 starts its file at 0 and reaches 245; read at these moments:
    assert [c.feed(x) for x in (0, 100, 490, 490, 3, 245, 245)] == [0, 100, 490, 490, 493, 735, 735]
