"""The log path as the daemon runs it: the server writes a pipe, the log keeper writes rotating files,
LogCapture follows them into memory from a position that survives a daemon restart."""

from __future__ import annotations

import os
import re
import resource
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from fakeclock import FakeClock

from supervisor.logs.reader import LogCapture, LogPosition, _Splitter
from supervisor.process import ServerProcess, spawn_log_keeper
from supervisor.process.control import keeper_env

SpawnFn = Callable[..., ServerProcess]
WaitFn = Callable[..., bool]


class Keeper:
    """A real log keeper process and the write end of its pipe (what a server would hold)."""

    def __init__(self, log_dir: Path, max_bytes: int, backups: int) -> None:
        self.log_dir = log_dir
        self.proc, fd, kept = spawn_log_keeper(str(log_dir), "server.log", max_bytes, backups, dict(os.environ))
        os.close(kept)  # the daemon's spare read end; these tests play the daemon without it
        self.out = os.fdopen(fd, "wb", buffering=0)

    def write(self, *chunks: bytes) -> None:
        for chunk in chunks:
            self.out.write(chunk)

    def finish(self) -> None:
        """Close the pipe (the server is gone) and wait for the keeper to write everything and end."""
        if not self.out.closed:
            self.out.close()
        assert self.proc.wait(20) == 0

    def files(self) -> list[Path]:
        """The log files (not the keeper's stats file), newest first."""
        return sorted(self.log_dir.glob("server.log*")) if self.log_dir.exists() else []


@pytest.fixture
def keeper(tmp_path: Path) -> Iterator[Callable[..., Keeper]]:
    made: list[Keeper] = []

    def _make(max_bytes: int = 1 << 20, backups: int = 2, log_dir: Path | None = None) -> Keeper:
        made.append(Keeper(log_dir or tmp_path / "logs", max_bytes, backups))
        return made[-1]

    yield _make
    for k in made:
        if not k.out.closed:
            k.out.close()
        k.proc.wait(20)


@pytest.fixture
def follow(tmp_path: Path) -> Iterator[Callable[..., LogCapture]]:
    """`follow(**options)`: a started LogCapture on tmp_path/logs, closed after the test."""
    made: list[LogCapture] = []

    def _make(**kw: Any) -> LogCapture:
        opts: dict[str, Any] = {"memory_lines": 1000, "poll_s": 0.01, **kw}
        made.append(LogCapture(tmp_path / "logs", **opts).start())
        return made[-1]

    yield _make
    for cap in made:
        cap.close(timeout=1.0)


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


# --- following what the keeper writes -----------------------------------------


def test_lines_with_seq_stream_and_clock(
    tmp_path: Path, keeper: Callable[..., Keeper], follow: Callable[..., LogCapture]
) -> None:
    clock = FakeClock(start=50.0)
    cap = follow(monotonic=clock.monotonic)
    k = keeper()
    k.write(b"one\ntwo\n", b"three")
    k.finish()
    cap.close()  # reads what the files hold; the unterminated last line arrives at the end
    lines = cap.lines_since(0)
    assert [(line.seq, line.text, line.stream, line.at) for line in lines] == [
        (1, "one", "stderr", 50.0),
        (2, "two", "stderr", 50.0),
        (3, "three", "stderr", 50.0),
    ]
    assert cap.latest_seq == 3
    assert [line.text for line in cap.lines_since(2)] == ["three"]
    assert cap.lines_since(3) == []
    assert cap.tail(2) == ["two", "three"]
    assert (tmp_path / "logs" / "server.log").read_bytes() == b"one\ntwo\nthree"
    assert cap.stats.bytes == len(b"one\ntwo\nthree")


def test_lines_arrive_while_the_server_runs(
    keeper: Callable[..., Keeper], follow: Callable[..., LogCapture], wait_until: WaitFn
) -> None:
    k = keeper()
    cap = follow()
    k.write(b"loading\n")
    assert wait_until(lambda: _texts(cap) == ["loading"], timeout=10)
    k.write(b"ready\n")
    assert wait_until(lambda: _texts(cap) == ["loading", "ready"], timeout=10)


def test_carriage_return_progress_updates_are_lines(
    keeper: Callable[..., Keeper], follow: Callable[..., LogCapture]
) -> None:
    cap = follow()
    k = keeper()
    bar = b"".join(
        b"Loading safetensors checkpoint shards: %3d%% Completed | %d/64\r" % (p, p) for p in range(0, 65, 8)
    )
    k.write(bar, b"\ndone\n")
    k.finish()
    cap.close()
    texts = _texts(cap)
    assert len(texts) == 10
    assert texts[0].endswith("| 0/64") and texts[8].endswith("| 64/64")
    assert texts[-1] == "done"


def test_invalid_utf8_and_a_huge_line_do_not_break_capture(
    tmp_path: Path, keeper: Callable[..., Keeper], follow: Callable[..., LogCapture]
) -> None:
    cap = follow(max_line_chars=4096)
    k = keeper(max_bytes=4 << 20)
    huge = b"z" * (1 << 20)  # 1 MB without a newline
    k.write(b"bad \xff\xfe bytes \xc3\n")
    for i in range(0, len(huge), 100_000):
        k.write(huge[i : i + 100_000])
    k.write(b"\nafter the flood\n")
    k.finish()
    cap.close()
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
    assert cap.stats.bytes == len(huge) + 15 + 17 == (tmp_path / "logs" / "server.log").stat().st_size


def test_memory_is_a_ring(keeper: Callable[..., Keeper], follow: Callable[..., LogCapture]) -> None:
    cap = follow(memory_lines=100)
    k = keeper()
    k.write(b"".join(b"line %d\n" % i for i in range(1000)))
    k.finish()
    cap.close()
    lines = cap.lines_since(0)
    assert len(lines) == 100
    assert lines[0].seq == 901 and lines[-1].text == "line 999"
    assert [line.seq for line in cap.lines_since(990)] == list(range(991, 1001))
    assert cap.stats.lines == 1000
    assert cap.stats.dropped_from_memory == 900


def _numbered(lo: int, hi: int) -> bytes:
    return b"".join(b"%06d %s\n" % (i, b"x" * 90) for i in range(lo, hi))


@pytest.mark.integration  # a keeper process through 40 rotations
@pytest.mark.parametrize("backups", [0, 3])
def test_follows_rotations_without_losing_a_line(
    backups: int, keeper: Callable[..., Keeper], follow: Callable[..., LogCapture], wait_until: WaitFn
) -> None:
    cap = follow(memory_lines=5000)
    k = keeper(max_bytes=10_000, backups=backups)
    # Batches of half a file: at most one rotation between two reads (more would outrun backups=0).
    for batch in range(40):
        k.write(_numbered(batch * 50, batch * 50 + 50))
        assert wait_until(lambda b=batch: cap.latest_seq == (b + 1) * 50, timeout=20), cap.stats
    k.finish()
    assert [int(t.split()[0]) for t in _texts(cap)] == list(range(2000))
    assert cap.stats.files_skipped == 0
    assert len(k.files()) == backups + 1


def test_a_new_reader_resumes_at_the_saved_position(
    tmp_path: Path, keeper: Callable[..., Keeper], follow: Callable[..., LogCapture], wait_until: WaitFn
) -> None:
    k = keeper(max_bytes=10_000, backups=5)
    first = follow()
    k.write(_numbered(0, 50), b"000050 partial")
    assert wait_until(lambda: first.latest_seq == 50, timeout=10)
    saved = first.position
    assert saved is not None and saved.offset == 50 * 98  # after the last complete line
    first._stop.set()  # the daemon is gone (SIGKILL): nothing is flushed
    assert first._thread is not None
    first._thread.join(5)
    k.write(b" line\n", _numbered(51, 300))  # written while no daemon reads: two rotations
    second = follow(start=saved)
    k.finish()
    second.close()
    assert [t.split()[0] for t in _texts(second)] == ["000050", *(f"{i:06d}" for i in range(51, 300))]
    assert _texts(second)[0] == "000050 partial line"
    assert second.stats.files_skipped == 0


def test_closing_shows_a_partial_line_but_a_successor_resumes_before_it(
    tmp_path: Path, keeper: Callable[..., Keeper], follow: Callable[..., LogCapture], wait_until: WaitFn
) -> None:
    k = keeper()
    cap = follow()
    k.write(b"whole\n", b"half")
    log = tmp_path / "logs" / "server.log"
    assert wait_until(lambda: log.exists() and log.stat().st_size == 10, timeout=10)
    cap.close()  # a handoff: the daemon exits, the server goes on writing that line
    assert _texts(cap) == ["whole", "half"]
    position = cap.position
    assert position is not None and position.offset == 6
    k.write(b" done\n")
    k.finish()
    successor = follow(start=position)
    successor.close()
    assert _texts(successor) == ["half done"]


def test_a_position_whose_file_is_gone_starts_at_the_oldest_file(
    keeper: Callable[..., Keeper], follow: Callable[..., LogCapture]
) -> None:
    k = keeper()
    k.write(b"kept\n")
    k.finish()
    cap = follow(start=LogPosition(inode=1, offset=123))
    cap.close()
    assert _texts(cap) == ["kept"] and cap.stats.files_skipped == 1


def test_end_of_is_where_a_new_launch_begins(tmp_path: Path, keeper: Callable[..., Keeper]) -> None:
    assert LogCapture.end_of(tmp_path / "logs") is None
    k = keeper()
    k.write(b"old launch\n")
    k.finish()
    end = LogCapture.end_of(tmp_path / "logs")
    assert end is not None and end.offset == 11
    k2 = keeper()
    k2.write(b"new launch\n")
    k2.finish()
    cap = LogCapture(tmp_path / "logs", memory_lines=10, start=end).start()
    cap.close()
    assert _texts(cap) == ["new launch"]


# --- the keeper ------------------------------------------------------------------


def test_keeper_files_rotate_under_their_cap(keeper: Callable[..., Keeper]) -> None:
    k = keeper(max_bytes=10_000, backups=2)
    k.write(*(b"%06d %s\n" % (i, b"x" * 90) for i in range(2000)))
    k.finish()
    files = k.files()
    assert [f.name for f in files] == ["server.log", "server.log.1", "server.log.2"]
    assert all(f.stat().st_size <= 10_000 for f in files)
    assert all(f.stat().st_size > 10_000 - 98 for f in files[1:])  # backups filled with whole lines
    newest = files[0].read_bytes().splitlines()
    assert newest[-1].startswith(b"001999 ")
    assert all(len(line) == 97 for line in newest)  # whole lines: rotation never splits one


def test_keeper_with_no_backups_keeps_only_the_current_file(keeper: Callable[..., Keeper]) -> None:
    k = keeper(max_bytes=1000, backups=0)
    k.write(*(b"%04d\n" % i for i in range(1000)))
    k.finish()
    assert [f.name for f in k.files()] == ["server.log"]
    assert k.files()[0].stat().st_size <= 1000


def test_keeper_ignores_sigterm_and_drains_until_the_last_writer_is_gone(
    keeper: Callable[..., Keeper], wait_until: WaitFn
) -> None:
    k = keeper()
    k.write(b"before\n")
    assert wait_until(lambda: k.files() and k.files()[0].stat().st_size > 0, timeout=10)  # past its start-up
    k.proc.send_signal(signal.SIGTERM)  # a stop of the tree, or a Ctrl-C, must not cut the last lines off
    k.proc.send_signal(signal.SIGINT)
    k.proc.send_signal(signal.SIGHUP)
    k.write(b"after\n")
    assert k.proc.poll() is None
    k.finish()
    assert k.files()[0].read_bytes() == b"before\nafter\n"


def test_unwritable_log_dir_never_blocks_the_writer(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the log directory should be")
    read_end, write_end = os.pipe()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "supervisor.logs.keeper",
            "--dir",
            str(blocker / "logs"),
            "--max-bytes",
            "1000",
            "--backups",
            "1",
        ],
        stdin=read_end,
        stderr=subprocess.PIPE,
    )
    os.close(read_end)
    with os.fdopen(write_end, "wb", buffering=0) as out:
        for _ in range(200):  # 20 MB: many pipe-fulls, so a keeper that stopped reading would block us
            out.write(b"y" * 99_999 + b"\n")
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0
    assert b"cannot write the server log" in err and err.count(b"\n") == 1  # reported once, not per write


def test_a_full_disk_is_counted_for_the_daemon_and_the_pipe_keeps_draining(tmp_path: Path) -> None:
    log_dir = tmp_path / "logs"
    read_end, write_end = os.pipe()

    def small_disk() -> None:  # writes past 5000 bytes fail with EFBIG, as on a full disk
        resource.setrlimit(resource.RLIMIT_FSIZE, (5000, 5000))

    argv = [sys.executable, "-m", "supervisor.logs.keeper", "--dir", str(log_dir), "--max-bytes", "100000"]
    proc = subprocess.Popen([*argv, "--backups", "1"], stdin=read_end, stderr=subprocess.DEVNULL, preexec_fn=small_disk)
    os.close(read_end)
    with os.fdopen(write_end, "wb", buffering=0) as out:
        for i in range(2000):
            out.write(b"line %06d\n" % i)
    assert proc.wait(30) == 0
    cap = LogCapture(log_dir, memory_lines=5000).start()
    cap.close()
    stats = cap.stats
    assert stats.write_errors >= 1 and "File too large" in stats.last_write_error
    assert 0 < stats.lines < 2000 and (log_dir / "server.log").stat().st_size <= 5000


def test_both_streams_of_a_real_child(tmp_path: Path, spawn: SpawnFn, keeper: Callable[..., Keeper]) -> None:
    code = "import sys; print('out', flush=True); print('err', file=sys.stderr, flush=True)"
    k = keeper()
    proc = spawn([sys.executable, "-c", code], output=k.out.fileno())
    k.out.close()
    assert proc.wait(10) == 0
    k.finish()
    cap = LogCapture(tmp_path / "logs", memory_lines=10).start()
    cap.close()
    assert _texts(cap) == ["out", "err"]


@pytest.mark.integration  # a daemon process and its server writing for seconds
def test_the_server_outlives_its_daemon_and_loses_no_line(tmp_path: Path, wait_until: WaitFn) -> None:
    """A daemon SIGKILLed mid-output: the server keeps writing (no SIGPIPE, no block), the files get every line."""
    daemon = textwrap.dedent(DAEMON)
    proc = subprocess.Popen([sys.executable, "-c", daemon, str(tmp_path / "logs")], stdout=subprocess.PIPE)
    assert proc.stdout is not None
    server_pid = int(proc.stdout.readline())
    log = tmp_path / "logs" / "server.log"
    assert wait_until(lambda: log.exists() and log.stat().st_size > 0, timeout=10)
    proc.kill()
    proc.wait(10)
    proc.stdout.close()
    assert wait_until(
        lambda: not psutil.pid_exists(server_pid) or psutil.Process(server_pid).status() == "zombie", timeout=30
    )
    text = b"".join(f.read_bytes() for f in sorted((tmp_path / "logs").glob("server.log*"), reverse=True)).decode()
    assert [int(x) for x in text.split()] == list(range(3000))


DAEMON = """
    import os, sys, time
    from pathlib import Path
    from supervisor.process.control import LogFiles, RealProcessControl
    server = "import time\\nfor i in range(3000):\\n    print(i, flush=True)\\n    time.sleep(0.001)"
    child = RealProcessControl().spawn([sys.executable, "-c", server], dict(os.environ), "m-" + str(os.getpid()),
                                       None, LogFiles(Path(sys.argv[1]), 5000, 20))
    print(child.pid, flush=True)
    time.sleep(60)
"""


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


@pytest.mark.integration  # 220 MB through a keeper process
def test_flood_of_220_mb_never_blocks_and_memory_stays_bounded(
    tmp_path: Path, spawn: SpawnFn, keeper: Callable[..., Keeper]
) -> None:
    me = psutil.Process()
    before = me.memory_info().rss
    peak = [before]
    stop = threading.Event()
    max_file = 20 << 20
    k = keeper(max_bytes=max_file, backups=3)
    cap = LogCapture(tmp_path / "logs", memory_lines=5000).start()
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
    proc = spawn([sys.executable, "-c", FLOOD, "220"], output=k.out.fileno())
    k.out.close()
    assert proc.wait(120) == 0, "the flooding child blocked"
    k.finish()
    elapsed = time.monotonic() - t0
    cap.close(timeout=60)
    stop.set()
    watcher.join()
    assert consumed

    stats = cap.stats
    blocks = -(-(220 << 20) // (73 * 12000))
    sizes = [f.stat().st_size for f in k.files()]
    assert len(sizes) == 4
    assert sum(sizes) <= 4 * max_file
    # Every line reached the files' chain; the reader kept up unless it fell 3 rotations behind.
    if stats.files_skipped == 0:
        assert stats.bytes == blocks * 73 * 12000 and stats.lines == blocks * 12000
    assert len(cap.lines_since(0)) == 5000
    growth_mb = (peak[0] - before) / 2**20
    print(f"flood: {elapsed:.1f} s, peak RSS growth {growth_mb:.0f} MB, {stats.lines} lines read")
    assert growth_mb < 150


@pytest.mark.integration
def test_simulator_log_flood(simulator: Callable[..., Any], wait_until: WaitFn) -> None:
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
        assert wait_until(lambda: sim.logs.stats.bytes >= 220 << 20, timeout=90), sim.logs.stats
    finally:
        stop.set()
        watcher.join()
    assert sim.proc.poll() is None or sim.proc.poll() == 0  # never blocked, never died of it
    growth_mb = (peak[0] - before) / 2**20
    assert growth_mb < 150, growth_mb
    assert wait_until(lambda: any("\ufffd" in line.text for line in sim.logs.lines_since(0)), timeout=10)
    assert sim.logs.stats.lines > 0


def test_the_keeper_gets_no_secret_and_can_still_import_its_package(tmp_path: Path) -> None:
    base = {"PATH": "/usr/bin", "HF_TOKEN": "hf_x", "SGLANG_SUPERVISOR_TOKEN": "t", "NOTIFY_SOCKET": "/run/n"}
    env = keeper_env(base)
    assert set(env) == {"PATH", "PYTHONPATH"}
    # Run from "/" with only that environment, as the daemon starts it: it imports and keeps lines.
    env = {**env, "PATH": os.environ["PATH"]}
    proc, fd, kept = spawn_log_keeper(str(tmp_path / "logs"), "server.log", 1000, 1, env)
    os.close(kept)
    with os.fdopen(fd, "wb", buffering=0) as out:
        out.write(b"hello\n")
    assert proc.wait(20) == 0
    assert (tmp_path / "logs" / "server.log").read_bytes() == b"hello\n"


def test_a_quiet_log_is_looked_at_less_often_and_a_new_line_still_arrives(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, wait_until: WaitFn
) -> None:
    """Issue 51: at a steady 50 ms the reader of a quiet log cost 0.2 % of a core alone. It backs off
    to `idle_poll_s`; each idle look is one stat of the log's path, counted here."""
    log_dir = tmp_path / "logs"
    log_dir.mkdir()
    log = log_dir / "server.log"
    log.write_bytes(b"first\n")
    looks: list[float] = []
    real_stat = os.stat

    def counting_stat(path: Any, *args: Any, **kw: Any) -> os.stat_result:
        if str(path) == str(log):
            looks.append(time.monotonic())
        return real_stat(path, *args, **kw)

    cap = LogCapture(log_dir, memory_lines=100, poll_s=0.05, idle_poll_s=0.25).start()
    try:
        assert wait_until(lambda: _texts(cap) == ["first"], timeout=10)
        monkeypatch.setattr(os, "stat", counting_stat)
        time.sleep(3.0)
        quiet = len(looks)
        # 60 looks at a steady 50 ms; backing off, about 12 (3 s / 0.25 s, and the ramp 0.05-0.2 s).
        assert 0 < quiet < 25, looks
        with open(log, "ab") as f:
            f.write(b"second\n")
        assert wait_until(lambda: _texts(cap) == ["first", "second"], timeout=10)
    finally:
        monkeypatch.undo()
        cap.close(timeout=1.0)
