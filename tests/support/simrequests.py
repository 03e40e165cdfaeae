"""Asking a simulated server directly (a `Sim` of the simulator tests' conftest): one metric's value
from its `/metrics`, and a completion sent on a thread that may hang."""

from __future__ import annotations

import contextlib
import threading
from typing import Any

from prometheus_client.parser import text_string_to_metric_families


def sample(s: Any, name: str) -> float:
    """The value of the sample `name` in the server's `/metrics` (AssertionError when absent)."""
    status, body = s.request("/metrics")
    assert status == 200
    for family in text_string_to_metric_families(body.decode()):
        for x in family.samples:
            if x.name == name:
                return float(x.value)
    raise AssertionError(f"{name} not exposed")


def in_background(s: Any, body: dict[str, object], timeout: float) -> dict[str, object]:
    """Send a completion on a thread; the dict gets its status (or stays empty while it hangs)."""
    result: dict[str, object] = {}

    def run() -> None:
        with contextlib.suppress(OSError):
            result["status"], result["body"] = s.request("/v1/completions", body, timeout)

    threading.Thread(target=run, daemon=True).start()
    return result
