from __future__ import annotations

import errno
import os
import re
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

import psutil
import pytest

from supervisor import logcapture
from supervisor.clock import FakeClock
from supervisor.logcapture import READ_SIZE, LogCapture, _Splitter
from supervisor.process import ServerProcess

SpawnFn = Callable[..., ServerProcess]


CaptureFn = Callable[..., LogCapture]


@pytest.fixture
def capture(tmp_path: Path) -> Iterator[CaptureFn]:
    """`capture(**options)`: a LogCapture writing under tmp_path/logs, closed after the test."""
    made: list[LogCapture] = []

    def _make(log_dir: Path | None = None, **kw: Any) -> LogCapture:
        opts: dict[str, Any] = {"max_file_bytes": 1 << 20, "backups": 2, "memory_lines": 1000, **kw}
        made.append(LogCapture(log_dir or tmp_path / "logs", **opts))
        return made[-1]

    yield _make
    for cap in made:
        cap.close(timeout=1.0)


@pytest.fixture
def pipe() -> Iterator[tuple[IO[bytes], IO[bytes]]]:
    r, w = os.pipe()
    reader, writer = os.fdopen(r, "rb", buffering=0), os.fdopen(w, "wb", buffering=0)
    yield reader, writer
    if not writer.closed:
        writer.close()
    if not reader.closed:
        reader.close()


def _feed(cap: LogCapture, pipe: tuple[IO[bytes], IO[bytes]], *chunks: bytes) -> None:
    reader, writer = pipe
    cap.attach(reader, "stdout")
    for chunk in chunks:
        writer.write(chunk)
    writer.close()
    assert cap.join(5)


def _texts(cap: LogCapture) -> list[str]:
    return [line.text for line in cap.lines_since(0)]


# --- splitting ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("chunks", "lines"),
    [
        ([b"a\nb\n"], [b"a", b"b"]),
        ([b"a\r\nb\r\n"], [b"a", b"b"]),
        ([b"10%\r20%\r30%\n"], [b"10%", b"20%", b"30%"]),
        ([b"a\r", b"\nb\n"], [b"a", b"b"]),  # \r\n split across two reads is one terminator
        ([b"a\r", b"\rb\n"], [b"a", b"", b"b"]),
        ([b"par", b"tial", b"\n"], [b"partial"]),
        ([b"\n\n"], [b"", b""]),
    ],
)
def test_splitter(chunks: list[bytes], lines: list[bytes]) -> None:
    splitter = _Splitter(1024)
    got: list[bytes] = []
    raw = b""
    for chunk in chunks:
        more, written = splitter.feed(chunk)
        got += more
        raw += written
    assert got == lines
    assert raw == b"".join(chunks)  # the file gets every byte, terminators included
    assert splitter.flush() == b""


def test_splitter_bounds_a_partial_line() -> None:
    splitter = _Splitter(100)
    lines, _ = splitter.feed(b"x" * 60)
    assert lines == []
    lines, raw = splitter.feed(b"y" * 60)
    assert lines == [b"x" * 60 + b"y" * 60]
    assert raw == b"x" * 60 + b"y" * 60
    assert splitter.feed(b"tail")[0] == []
    assert splitter.flush() == b"tail"


# --- capture through a pipe ------------------------------------------------


def test_lines_with_seq_stream_and_clock(tmp_path: Path, pipe: tuple[IO[bytes], IO[bytes]], capture: CaptureFn) -> None:
    clock = FakeClock(start=50.0)
    cap = capture(monotonic=clock.monotonic)
    _feed(cap, pipe, b"one\ntwo\n", b"three")
    lines = cap.lines_since(0)
    assert [(line.seq, line.text, line.stream, line.at) for line in lines] == [
        (1, "one", "stdout", 50.0),
        (2, "two", "stdout", 50.0),
        (3, "three", "stdout", 50.0),  # the unterminated last line arrives at EOF
    ]
    assert cap.latest_seq == 3
    assert [line.text for line in cap.lines_since(2)] == ["three"]
    assert cap.lines_since(3) == []
    assert cap.tail(2) == ["two", "three"]
    assert cap.eof
    cap.close()
    assert (tmp_path / "logs" / "server.log").read_bytes() == b"one\ntwo\nthree"
    assert cap.stats.bytes == len(b"one\ntwo\nthree")


def test_carriage_return_progress_updates_are_lines(
    tmp_path: Path, pipe: tuple[IO[bytes], IO[bytes]], capture: CaptureFn
) -> None:
    cap = capture()
    bar = b"".join(
        b"Loading safetensors checkpoint shards: %3d%% Completed | %d/64\r" % (p, p) for p in range(0, 65, 8)
    )
    _feed(cap, pipe, bar, b"\ndone\n")
    texts = _texts(cap)
    assert len(texts) == 10
    assert texts[0].endswith("| 0/64") and texts[8].endswith("| 64/64")
    assert texts[-1] == "done"


def test_invalid_utf8_and_a_huge_line_do_not_break_capture(
    tmp_path: Path, pipe: tuple[IO[bytes], IO[bytes]], capture: CaptureFn
) -> None:
    cap = capture(max_line_chars=4096, max_file_bytes=4 << 20)
    huge = b"z" * (1 << 20)  # 1 MB without a newline
    reader, writer = pipe
    cap.attach(reader, "stderr")
    writer.write(b"bad \xff\xfe bytes \xc3\n")
    for i in range(0, len(huge), 100_000):
        writer.write(huge[i : i + 100_000])
    writer.write(b"\nafter the flood\n")
    writer.close()
    assert cap.join(5)
    texts = _texts(cap)
    assert texts[0] == "bad \ufffd\ufffd bytes \ufffd"
    assert texts[-1] == "after the flood"
    pieces = texts[1:-1]  # the huge line comes in bounded pieces, each cut in memory
    assert 1 <= len(pieces) <= (1 << 20) // (64 << 10) + 1
    assert all(len(t) < 4200 for t in pieces)
    truncated = [re.fullmatch(r"(z{4096}) …\[truncated (\d+) bytes\]", t) for t in pieces]
    assert sum(m is not None for m in truncated) >= len(pieces) - 1  # the last piece may be short
    assert cap.stats.truncated_lines == sum(m is not None for m in truncated)
    accounted = sum(4096 + int(m.group(2)) if m else len(t) for m, t in zip(truncated, pieces, strict=True))
    assert accounted == len(huge)
    assert cap.stats.bytes == len(huge) + 15 + 17
    cap.close()
    assert (tmp_path / "logs" / "server.log").stat().st_size == cap.stats.bytes


def test_memory_is_a_ring(tmp_path: Path, pipe: tuple[IO[bytes], IO[bytes]], capture: CaptureFn) -> None:
    cap = capture(memory_lines=100)
    _feed(cap, pipe, b"".join(b"line %d\n" % i for i in range(1000)))
    lines = cap.lines_since(0)
    assert len(lines) == 100
    assert lines[0].seq == 901 and lines[-1].text == "line 999"
    assert [line.seq for line in cap.lines_since(990)] == list(range(991, 1001))
    assert cap.stats.lines == 1000
    assert cap.stats.dropped_from_memory == 900


def test_files_rotate_under_their_cap(tmp_path: Path, pipe: tuple[IO[bytes], IO[bytes]], capture: CaptureFn) -> None:
    cap = capture(max_file_bytes=10_000, backups=2)
    _feed(cap, pipe, *(b"%06d %s\n" % (i, b"x" * 90) for i in range(2000)))
    cap.close()
    files = sorted((tmp_path / "logs").iterdir())
    assert [f.name for f in files] == ["server.log", "server.log.1", "server.log.2"]
    assert all(f.stat().st_size <= 10_000 for f in files)
    assert all(f.stat().st_size > 10_000 - 98 for f in files[1:])  # backups filled with whole lines
    newest = (tmp_path / "logs" / "server.log").read_bytes().splitlines()
    assert newest[-1].startswith(b"001999 ")
    assert all(len(line) == 97 for line in newest)  # whole lines: rotation never splits one


def test_no_backups_keeps_only_the_current_file(
    tmp_path: Path, pipe: tuple[IO[bytes], IO[bytes]], capture: CaptureFn
) -> None:
    cap = capture(max_file_bytes=1000, backups=0)
    _feed(cap, pipe, *(b"%04d\n" % i for i in range(1000)))
    cap.close()
    assert [f.name for f in (tmp_path / "logs").iterdir()] == ["server.log"]
    assert (tmp_path / "logs" / "server.log").stat().st_size <= 1000


def test_unwritable_log_dir_is_counted_and_lines_still_flow(
    tmp_path: Path, pipe: tuple[IO[bytes], IO[bytes]], capture: CaptureFn
) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the log directory should be")
    cap = capture(blocker / "logs")
    _feed(cap, pipe, b"first\n", b"second\n")
    assert _texts(cap) == ["first", "second"]
    stats = cap.stats
    assert stats.write_errors >= 1
    assert "NotADirectoryError" in stats.last_write_error or "FileExistsError" in stats.last_write_error
    cap.close()


def test_disk_full_is_counted_and_the_pipe_keeps_draining(
    tmp_path: Path, pipe: tuple[IO[bytes], IO[bytes]], monkeypatch: pytest.MonkeyPatch, capture: CaptureFn
) -> None:
    real_open = open

    class FullDisk:
        def __init__(self, f: IO[bytes]) -> None:
            self._f = f

        def write(self, data: bytes) -> int:
            raise OSError(errno.ENOSPC, "No space left on device")

        def tell(self) -> int:
            return self._f.tell()

        def close(self) -> None:
            self._f.close()

    def full_open(path: Any, mode: str = "r", buffering: int = -1) -> Any:
        return FullDisk(real_open(path, mode, buffering))

    monkeypatch.setattr(logcapture, "open", full_open, raising=False)
    cap = capture()
    _feed(cap, pipe, *(b"line %d\n" % i for i in range(50)))
    assert len(_texts(cap)) == 50
    assert cap.stats.write_errors >= 1
    assert "No space left" in cap.stats.last_write_error
    cap.close()


def test_both_streams_of_a_real_child(tmp_path: Path, spawn: SpawnFn, capture: CaptureFn) -> None:
    code = "import sys; print('out', flush=True); print('err', file=sys.stderr, flush=True)"
    proc = spawn([sys.executable, "-c", code])
    cap = capture()
    cap.attach(proc.stdout, "stdout")
    cap.attach(proc.stderr, "stderr")
    assert cap.join(10)
    assert cap.eof
    assert sorted((line.stream, line.text) for line in cap.lines_since(0)) == [("stderr", "err"), ("stdout", "out")]
    assert proc.wait(5) == 0
    cap.close()


FLOOD = """
import sys
line = b"[2025-01-01 00:00:00 TP0] Decode batch, #running-req: 1, #token: %07d\\n"
block = b"".join(line % i for i in range(12000))
out = sys.stdout.buffer
written = 0
while written < int(sys.argv[1]) << 20:
    out.write(block)
    written += len(block)
out.flush()
"""


def test_flood_of_220_mb_never_blocks_and_memory_stays_bounded(
    tmp_path: Path, spawn: SpawnFn, capture: CaptureFn
) -> None:
    me = psutil.Process()
    before = me.memory_info().rss
    peak = [before]
    stop = threading.Event()
    max_file = 20 << 20
    cap = capture(max_file_bytes=max_file, backups=3, memory_lines=5000)
    consumed: list[int] = []  # a reader polling like the log probe, concurrently with the flood

    def watch() -> None:
        last = 0
        while not stop.is_set():
            peak[0] = max(peak[0], me.memory_info().rss)
            lines = cap.lines_since(last)
            if lines:
                assert lines[0].seq > last and lines[-1].seq - lines[0].seq == len(lines) - 1
                last = lines[-1].seq
                consumed.append(len(lines))
            time.sleep(0.1)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    t0 = time.monotonic()
    proc = spawn([sys.executable, "-c", FLOOD, "220"])
    cap.attach(proc.stdout, "stdout")
    cap.attach(proc.stderr, "stderr")
    assert proc.wait(60) == 0, "the flooding child blocked"
    assert cap.join(30)
    elapsed = time.monotonic() - t0
    stop.set()
    watcher.join()
    assert consumed

    stats = cap.stats
    assert stats.bytes >= 220 << 20
    assert stats.bytes == -(-(220 << 20) // (73 * 12000)) * 73 * 12000  # whole blocks of 12000 lines
    assert stats.lines == stats.bytes // 73  # every line seen
    assert len(cap.lines_since(0)) == 5000
    cap.close()
    sizes = [f.stat().st_size for f in (tmp_path / "logs").iterdir()]
    assert len(sizes) == 4
    assert sum(sizes) <= 4 * max_file + READ_SIZE
    growth_mb = (peak[0] - before) / 2**20
    print(f"flood: {elapsed:.1f} s, peak RSS growth {growth_mb:.0f} MB, {stats.lines} lines")
    assert growth_mb < 150
    assert elapsed < 60


@pytest.mark.integration
def test_simulator_log_flood(simulator: Callable[..., Any], wait_until: Callable[..., bool]) -> None:
    me = psutil.Process()
    before = me.memory_info().rss
    peak = [before]
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], me.memory_info().rss)
            time.sleep(0.02)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        sim = simulator("log_flood", 1, {"SGLANG_SIM_FLOOD_MB": "220"})
        assert wait_until(lambda: sim.logs.stats.bytes >= 220 << 20, timeout=60), sim.logs.stats
    finally:
        stop.set()
        watcher.join()
    assert sim.proc.poll() is None or sim.proc.poll() == 0  # never blocked, never died of it
    growth_mb = (peak[0] - before) / 2**20
    assert growth_mb < 150, growth_mb
    assert wait_until(lambda: any("\ufffd" in line.text for line in sim.logs.lines_since(0)), timeout=10)
    stats = sim.logs.stats
    assert stats.lines > 0 and stats.write_errors == 0
