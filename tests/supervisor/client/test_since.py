"""`events --since`: an ISO time or a span back from now (issue 38: `--since 1h` was refused)."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from supervisor.client.verbs import UsageError, _since

NOW = datetime(2026, 12, 2, 12, 0, 0, tzinfo=timezone.utc)


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("1h", "2026-12-02T11:00:00+00:00"),
        ("30m", "2026-12-02T11:30:00+00:00"),
        ("90s", "2026-12-02T11:58:30+00:00"),
        ("2d", "2026-11-30T12:00:00+00:00"),
        ("1.5h", "2026-12-02T10:30:00+00:00"),
        ("2026-12-01T08:00:00", "2026-12-01T08:00:00+00:00"),
        ("2026-12-01T08:00:00Z", "2026-12-01T08:00:00+00:00"),
    ],
)
def test_since_takes_spans_and_times(text: str, want: str) -> None:
    assert _since(text, now=NOW) == want


@pytest.mark.parametrize("text", ["yesterday", "1w", "h", "-1h", ""])
def test_a_since_that_is_neither_says_both_forms(text: str) -> None:
    with pytest.raises(UsageError, match=r"ISO-8601 time .* span back from now \(90s, 30m, 1h, 2d\)"):
        _since(text, now=NOW)
