"""Helper processes that say one word on stdout once they are set up (a segment mapped, a lock
held) and live until the test ends: started, awaited and killed in one place."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Protocol


class Start(Protocol):
    def __call__(
        self, argv: Sequence[str], word: str, env: Mapping[str, str] | None = None
    ) -> subprocess.Popen[str]: ...


@contextmanager
def saying_children() -> Iterator[Start]:
    """`start(argv, word)` runs `argv` and returns once it printed `word`; all are killed at exit."""
    started: list[subprocess.Popen[str]] = []

    def start(argv: Sequence[str], word: str, env: Mapping[str, str] | None = None) -> subprocess.Popen[str]:
        p = subprocess.Popen(list(argv), stdout=subprocess.PIPE, text=True, env=None if env is None else dict(env))
        started.append(p)
        assert p.stdout is not None and p.stdout.readline().strip() == word
        return p

    try:
        yield start
    finally:
        for p in started:
            p.kill()
            p.wait()
            if p.stdout is not None:
                p.stdout.close()
