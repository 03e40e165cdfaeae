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
    from supervisor.warmstart.cacheplace import Refused, judge, opened

    if not settings.caches.pin:
        return []
    euid = os.geteuid() if euid is None else euid
    note = ""
    try:
        with opened(settings.cache_dir, euid, create=False) as base:
            note = base.note
    except FileNotFoundError:  # `run` makes what is missing (0700) on the way checked so far
        real = os.path.realpath(settings.cache_dir)
        if os.path.isdir(real):  # the private sub-directory is what is missing
            st = os.stat(real)
            note = judge(real, st.st_uid, st.st_mode, euid)[1]
    except Refused as why:
        return [("warning", "paths.cache_dir", f"{why}; `run` launches the server with its kernel caches unpinned")]
    except OSError as err:
        return [("warning", "paths.cache_dir", f"{settings.cache_dir}: {err.strerror or err}")]
    return [("warning", "paths.cache_dir", f"{note}; name a directory of the daemon's own")] if note else []
