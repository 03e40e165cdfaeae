"""What `status` and the page say about notifications (issue 38: failures were invisible): per
`[[notify]]` target, the deliveries since the daemon started by outcome and the last failure, from
the journal's `notification` records as they are written (a journal listener: no file read)."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from supervisor.status.snapshot import NotifyView


@dataclass
class _Target:
    ok: int = 0
    failed: int = 0
    dropped: int = 0
    last_error: str = ""
    last_failed_at: str | None = None
    last_ok_at: str | None = None


@dataclass
class NotifyTally:
    _targets: dict[str, _Target] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def feed(self, record: dict[str, object]) -> None:
        """A journal record; only `notification` ones count. Never raises."""
        if record.get("event") != "notification":
            return
        name, outcome = str(record.get("target") or "?"), record.get("outcome")
        at = str(record.get("ts") or "")
        with self._lock:
            t = self._targets.setdefault(name[:100], _Target())
            if outcome == "ok":
                t.ok += 1
                t.last_ok_at = at
            elif outcome in ("failed", "dropped"):
                if outcome == "failed":
                    t.failed += 1
                else:
                    t.dropped += 1
                t.last_failed_at = at
                t.last_error = str(record.get("error") or outcome)[:300]

    def views(self) -> tuple[NotifyView, ...]:
        with self._lock:
            return tuple(
                NotifyView(
                    target=name,
                    ok=t.ok,
                    failed=t.failed,
                    dropped=t.dropped,
                    last_error=t.last_error,
                    last_failed_at=t.last_failed_at,
                    last_ok_at=t.last_ok_at,
                )
                for name, t in sorted(self._targets.items())
            )
