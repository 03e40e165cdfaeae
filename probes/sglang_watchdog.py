"""SGLang's own watchdog, read from its log (SGLang 0.5.16, `srt/utils/watchdog.py`).

When a forward batch (and, in later releases, initialisation) makes no progress for
`--watchdog-timeout` seconds, the scheduler's watchdog thread logs one py-spy pass of its own
process, then `Scheduler watchdog timeout (self.watchdog_timeout=300.0, self.soft=False)`, sleeps
5 s and sends SIGQUIT to the main process, which kills the whole tree. The dump is one log record
whose message spans many lines:

    [2026-12-01 10:00:00 TP0] Pyspy dump for PID 4242 (py-spy dump --native --pid 4242):
    Process 4242: sglang::scheduler_TP0
    Python v3.12.3 (/usr/bin/python3.12)

    Thread 4242 (active+gil): "MainThread"
        synchronize (torch/cuda/streams.py:225)
        ...

or `Pyspy failed (py-spy dump --native --pid 4242). Error: ...` when py-spy is missing. With
`--soft-watchdog-timeout` the same lines come with `self.soft=True` and nothing is killed.
This parser keeps the dumps and the firing; it never decides anything.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from probes.logs import LOG_PREFIX
from probes.types import LogLine, SGLangWatchdogFire

MAX_DUMP_LINES = 2000  # per dump: a py-spy --native dump of a busy scheduler is a few hundred
MAX_DUMPS = 16
_DUMP = re.compile(r"Pyspy dump for PID (?P<pid>\d{1,10}) \((?P<cmd>[^)]{0,200})\):\s*$")
_FAILED = re.compile(r"Pyspy failed \((?P<cmd>[^)]{0,200})\)\. Error: (?P<err>.{0,300})")
_FIRED = re.compile(
    r"(?P<name>[A-Za-z][\w ]{0,60}?) watchdog timeout \(self\.watchdog_timeout=(?P<timeout>[\d.]{1,20}),"
    r" self\.soft=(?P<soft>True|False)\)"
)
# What a py-spy dump's lines look like: its headers, thread lines, indented frames, blank lines.
_DUMP_LINE = re.compile(r"^(?:Process \d+:|Python v|Thread (?:0x[0-9A-Fa-f]+|\d+) \(|\s+\S|\s*$)")


class SGLangWatchdogParser:
    def __init__(self) -> None:
        self._dumps: list[tuple[int, list[str]]] = []
        self._open: list[str] | None = None  # the dump whose lines are still arriving
        self._failures: list[str] = []
        self._fire: SGLangWatchdogFire | None = None

    def feed(self, lines: Iterable[LogLine]) -> None:
        for line in lines:
            self._line(line)

    def observe(self) -> SGLangWatchdogFire | None:
        return self._fire

    def _line(self, line: LogLine) -> None:
        text = line.text[:4096]
        prefixed = LOG_PREFIX.match(text)  # the same `[time TPn] ` prefix the log parser strips
        body = text[prefixed.end() :] if prefixed else text
        if self._open is not None:
            if not prefixed and _DUMP_LINE.match(text) and len(self._open) < MAX_DUMP_LINES:
                self._open.append(text)
                return
            self._open = None
        # Substring checks first: `_FIRED`'s search costs ~8 ms on a 4 KiB line without the words
        # (a 300 MB line is 4,800 of them, and the loop stood still for 30 s; issue 33).
        m = _DUMP.search(body) if "Pyspy dump for PID" in body else None
        if m:
            self._open = [text]
            self._dumps = [*self._dumps[-(MAX_DUMPS - 1) :], (int(m.group("pid")), self._open)]
            return
        m = _FAILED.search(body) if "Pyspy failed" in body else None
        if m:
            self._failures = [*self._failures[-(MAX_DUMPS - 1) :], f"{m.group('cmd')}: {m.group('err').strip()}"]
            return
        m = _FIRED.search(body) if " watchdog timeout (" in body else None
        if m and (self._fire is None or self._fire.soft):
            self._fire = SGLangWatchdogFire(
                at=line.at,
                name=m.group("name").strip(),
                timeout_s=_float(m.group("timeout")),
                soft=m.group("soft") == "True",
                line=body[:300],
                dumps=tuple((pid, "\n".join(lines)) for pid, lines in self._dumps),
                dump_errors=tuple(self._failures),
            )


def _float(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None
