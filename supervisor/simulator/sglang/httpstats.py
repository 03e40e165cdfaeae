"""SGLang 0.5.16's HTTP middleware metrics (utils/common.py add_prometheus_track_response_middleware):
requests by endpoint and method, responses by status, and the requests in flight, kept by the HTTP
process itself, so they stay live when the scheduler hangs."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field


@dataclass
class HttpStats:
    requests: dict[tuple[str, str], int] = field(default_factory=dict)  # (endpoint, method) -> count
    responses: dict[tuple[str, str, str], int] = field(default_factory=dict)  # (endpoint, status, method)
    active: dict[tuple[str, str], int] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @contextlib.contextmanager
    def track(self, endpoint: str, method: str) -> Iterator[list[int]]:
        """Counts the request while the block runs; put the status code into the yielded list."""
        key = (endpoint, method)
        status: list[int] = []
        with self._lock:
            self.requests[key] = self.requests.get(key, 0) + 1
            self.active[key] = self.active.get(key, 0) + 1
        try:
            yield status
        finally:
            with self._lock:
                self.active[key] -= 1
                if status:  # a response was sent (a dropped connection has none, as in SGLang)
                    rkey = (endpoint, str(status[0]), method)
                    self.responses[rkey] = self.responses.get(rkey, 0) + 1

    def snapshot(
        self,
    ) -> tuple[dict[tuple[str, str], int], dict[tuple[str, str, str], int], dict[tuple[str, str], int]]:
        with self._lock:
            return dict(self.requests), dict(self.responses), dict(self.active)
