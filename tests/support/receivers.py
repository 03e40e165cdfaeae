"""Real local HTTP receivers for notification tests: one that answers, one that hangs, one that fails."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from httpserver import QuietHandler, serving


@dataclass
class Received:
    calls: list[tuple[str, Any]] = field(default_factory=list)  # (path, JSON body)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def bodies(self, path: str) -> list[Any]:
        with self.lock:
            return [b for p, b in self.calls if p == path]


@contextmanager
def receiver(mode: str = "ok") -> Iterator[tuple[str, Received]]:
    """`ok` answers 200 (202 for /pd, as PagerDuty does), `fail` 500, `reject` 404, `hang` never answers."""
    got = Received()

    class Handler(QuietHandler):
        def do_POST(self) -> None:
            n = int(self.headers.get("Content-Length", "0"))
            raw = self.rfile.read(n)
            try:
                body: Any = json.loads(raw)
            except ValueError:
                body = raw.decode("utf-8", "replace")
            with got.lock:
                got.calls.append((self.path, body))
            if mode == "hang":
                self.server.stop.wait(30)
                return
            if mode == "fail":
                self.reply(500, b'{"error":"down"}')
                return
            if mode == "reject":
                self.reply(404, b"no such hook")
                return
            self.reply(202 if self.path.startswith("/pd") else 200, b"ok")

    with serving(Handler) as url:
        yield url, got
