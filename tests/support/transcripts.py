"""Real SGLang transcripts under tests/fixtures/real_sglang/<run>/ (format: the lead's GPU recipe).

Every directory there is a transcript; tests parametrize over `RUNS`, so a new real run is picked
up by dropping its directory in. Lines are read through the daemon's own LogCapture, byte for byte.
"""

from __future__ import annotations

import json
import re
import tempfile
import time
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from probes.types import LogLine
from supervisor.logs.reader import LogCapture, StreamName

ROOT = Path(__file__).resolve().parents[1] / "fixtures" / "real_sglang"
RUNS = sorted(p.name for p in ROOT.iterdir() if p.is_dir() and (p / "meta.json").exists()) if ROOT.exists() else []
_STAMP = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)")


@dataclass(frozen=True)
class HealthRow:
    t: float
    phase: str  # starting | ready | stalled
    status: int | None
    error: str | None
    latency_s: float


@dataclass(frozen=True)
class TitleRow:
    t: float
    pid: int
    ppid: int
    name: str
    cmdline: tuple[str, ...]

    @property
    def title(self) -> str:
        # setproctitle pads with spaces (psutil then splits on them): the title without the padding
        return " ".join(a for a in self.cmdline if a.strip()).rstrip() or self.name


class Transcript:
    def __init__(self, name: str) -> None:
        self.name = name
        self.path = ROOT / name

    @cached_property
    def meta(self) -> dict[str, object]:
        data = json.loads((self.path / "meta.json").read_text())
        assert isinstance(data, dict)
        return data

    @property
    def speculative(self) -> bool:
        argv = self.argv
        return bool(self.meta.get("speculative")) or "--speculative-algorithm" in argv

    @property
    def argv(self) -> list[str]:
        raw = self.meta.get("argv")
        return [str(a) for a in raw] if isinstance(raw, list) else []

    @property
    def tp_size(self) -> int:
        argv = self.argv
        for flag in ("--tp-size", "--tp"):
            if flag in argv:
                return int(argv[argv.index(flag) + 1])
        raw = self.meta.get("tp_size", self.meta.get("tp"))
        return int(raw) if isinstance(raw, int) else 1

    def mark(self, name: str) -> float | None:
        """A moment of the run (`ready_line`, `sigstop`, `sigcont`, `sigterm`), seconds after launch."""
        marks = self.meta.get("marks")
        events = self.meta.get("events")
        for source in (marks, events):
            if isinstance(source, dict):
                value = source.get(name, source.get(f"{name}_at"))
                if isinstance(value, (int, float)):
                    return float(value)
        return None

    def health_in(self, phase: str) -> list[HealthRow]:
        """Rows that describe the phase cleanly: a probe straddling a SIGSTOP or sent after the
        SIGCONT, or sent in the second before the ready line was noticed, is left out."""
        stop, cont, ready = self.mark("sigstop"), self.mark("sigcont"), self.mark("ready_line")
        rows = [r for r in self.health() if r.phase == phase]
        if phase == "ready" and stop is not None:
            rows = [r for r in rows if r.t + r.latency_s < stop]
        if phase == "stalled" and cont is not None:
            rows = [r for r in rows if r.t + r.latency_s < cont]
        if phase == "starting" and ready is not None:
            rows = [r for r in rows if r.t < ready - 1.0]
        return rows

    def raw(self, stream: str) -> bytes:
        f = self.path / f"{stream}.log"
        return f.read_bytes() if f.exists() else b""

    def lines(self, stream: str) -> list[LogLine]:
        """The stream as the daemon's LogCapture splits it (a carriage-return update is a line)."""
        return _capture(self.raw(stream), "stderr" if stream == "stderr" else "stdout")

    def messages(self, stream: str = "stderr") -> list[str]:
        return [line.text for line in self.lines(stream)]

    def metrics(self, phase: str) -> str | None:
        f = self.path / f"metrics_{phase}.txt"
        return f.read_text() if f.exists() else None

    def health(self) -> list[HealthRow]:
        rows = []
        for raw in (self.path / "health.jsonl").read_text().splitlines():
            if raw.strip():
                d = json.loads(raw)
                rows.append(HealthRow(float(d["t"]), d["phase"], d.get("status"), d.get("error"), d["latency_s"]))
        return rows

    def state_at(self, t: float) -> list[TitleRow]:
        """Each process's latest row at or before `t` (the recipe writes a row when something changed)."""
        latest: dict[int, TitleRow] = {}
        for r in self.titles():
            if r.t <= t:
                latest[r.pid] = r
        return sorted(latest.values(), key=lambda r: r.pid)

    def root_pid(self) -> int:
        rows = self.titles()
        pids = {r.pid for r in rows}
        return next(r.pid for r in rows if r.ppid not in pids)

    def titles(self) -> list[TitleRow]:
        rows = []
        for raw in (self.path / "titles.jsonl").read_text().splitlines():
            if raw.strip():
                d = json.loads(raw)
                rows.append(TitleRow(float(d["t"]), d["pid"], d["ppid"], d["name"], tuple(d["cmdline"])))
        return rows

    def json(self, name: str) -> object:
        return json.loads((self.path / name).read_text())


def _capture(data: bytes, stream: StreamName) -> list[LogLine]:
    """The daemon's reading of these bytes: as the log keeper writes them to server.log (both streams
    share its one pipe), followed by LogCapture from the start of the file."""
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "server.log").write_bytes(data)
        capture = LogCapture(Path(tmp), memory_lines=1_000_000).start()
        deadline = time.monotonic() + 30
        while capture.stats.bytes < len(data) and time.monotonic() < deadline:
            time.sleep(0.02)
        capture.close()  # an unterminated last line is shown too
        lines = capture.lines_since(0)
    return lines


def stamp_of(text: str) -> str | None:
    m = _STAMP.match(text)
    return m.group(1) if m else None
