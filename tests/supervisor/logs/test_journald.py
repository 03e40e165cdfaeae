"""The server's output to journald's native socket: a real log keeper process, a real datagram socket."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

from journalwire import parse

from supervisor.logs.journald import JournalSender, entry
from supervisor.process import spawn_log_keeper


def receiver(tmp_path: Path) -> tuple[socket.socket, str]:
    path = str(tmp_path / "journal.socket")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.settimeout(10)
    return sock, path


def test_entries_carry_identifier_priority_and_any_bytes() -> None:
    e = parse(entry(b"[2026-12-01 TP0] WARNING low memory\x00\xff", b"sglang"))
    assert e == {
        "SYSLOG_IDENTIFIER": b"sglang",
        "PRIORITY": b"4",
        "MESSAGE": b"[2026-12-01 TP0] WARNING low memory\x00\xff",
    }
    assert parse(entry(b"Traceback ... RuntimeError: ERROR in NCCL", b"x"))["PRIORITY"] == b"3"
    assert parse(entry(b"Loading safetensors 3/61", b"x"))["PRIORITY"] == b"6"


def test_a_missing_journal_drops_lines_and_never_raises(tmp_path: Path) -> None:
    s = JournalSender(str(tmp_path / "no-such.socket"), "sglang")
    s.write(b"one\ntwo\npart")
    s.close()
    assert (s.sent, s.dropped) == (0, 3)


def test_the_keepers_redaction_is_the_bundles_and_stays_light() -> None:
    from supervisor.diagnostics import Redactor
    from supervisor.logs.journald import pattern_redaction

    line = "export HF_TOKEN=hf_abcdefghijk; curl -H 'Authorization: Bearer abcdefghijkl' https://u:p4ssw0rd1@x/y"
    assert pattern_redaction()(line) == Redactor().text(line)
    # The keeper must not pull in the daemon's diagnostics package (its imports cost 0.2 s, 25 MB).
    probe = (
        "import sys, supervisor.logs.journald as j; j.pattern_redaction(); "
        "print('supervisor.diagnostics' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=30).stdout
    assert out.strip() == "False"


def test_the_keeper_copies_each_line_to_the_journal_and_keeps_the_file(tmp_path: Path) -> None:
    sock, path = receiver(tmp_path)
    try:
        keeper, write_end, kept = spawn_log_keeper(
            str(tmp_path / "logs"),
            "server.log",
            1 << 20,
            2,
            {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(Path(__file__).resolve().parents[3])},
            ("--journal-socket", path, "--journal-id", "sglang-test"),
        )
        payload = (
            b"ready line\nLoading 1/3\rLoading 3/3\n[TP0] ERROR boom\n"
            b"server_args=ServerArgs(api_key='sk-very-secret-1', model_path='https://u:pw-secret-2@hub/m')\n"
            b"last without newline"
        )
        os.write(write_end, payload)
        os.close(write_end)
        os.close(kept)  # the daemon's spare read end: the keeper ends once the last writer is gone
        assert keeper.wait(20) == 0
        got = [parse(sock.recv(65536)) for _ in range(5)]
        assert [g["MESSAGE"] for g in got] == [
            b"ready line",
            b"Loading 3/3",
            b"[TP0] ERROR boom",
            b"server_args=ServerArgs(api_key=[redacted], model_path='https://u:[redacted]@hub/m')",
            b"last without newline",
        ]  # the journal is read more widely than the state directory: secrets redacted as in bundles
        assert {g["SYSLOG_IDENTIFIER"] for g in got} == {b"sglang-test"} and got[2]["PRIORITY"] == b"3"
        assert (tmp_path / "logs" / "server.log").read_bytes() == payload  # the file stays the full record
    finally:
        sock.close()


def test_keeper_without_the_option_sends_nothing(tmp_path: Path) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "supervisor.logs.keeper", "--dir", str(tmp_path),
         "--max-bytes", "1000", "--backups", "1"],
        input=b"x\n",
        timeout=20,
    )
    assert r.returncode == 0 and (tmp_path / "server.log").read_bytes() == b"x\n"
