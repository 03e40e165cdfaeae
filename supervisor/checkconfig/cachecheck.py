"""`check-config` on `[paths] cache_dir` (issue 50): what `run` will make of it, judged for the user
running the check (the service's user may differ: run it as that user). A directory another user
can write is refused (the server launches with its kernel caches unpinned); a shared sticky one gets
a private `uid-<euid>/` of the daemon's. Nothing is created here."""

from __future__ import annotations

import os
from typing import Literal

from supervisor.config.settings import Settings

Found = tuple[Literal["error", "warning"], str, str]  # level, key, message (check.Finding's fields)


def cache_findings(settings: Settings, euid: int | None = None) -> list[Found]:
    from supervisor.warmstart.cacheplace import inspect

    if not settings.caches.pin:
        return []
    place, why = inspect(settings.cache_dir, os.geteuid() if euid is None else euid)
    if place == "refused":
        return [("warning", "paths.cache_dir", f"{why}; `run` launches the server with its kernel caches unpinned")]
    if place == "private":
        return [("warning", "paths.cache_dir", f"{why}; name a directory of the daemon's own")]
    return []
