"""`[logs] journal = true`: the server's own output reaches journald too, tagged, through the running
daemon's log keeper (a datagram socket stands in for /run/systemd/journal/socket)."""

from __future__ import annotations

import asyncio
import socket
import threading
from pathlib import Path

import pytest
from journalwire import parse

pytestmark = pytest.mark.integration


async def test_the_servers_lines_reach_the_journal_tagged_and_the_file_keeps_them(daemon, sim, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "journal.socket"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    sock.settimeout(0.2)
    got: list[dict[str, bytes]] = []
    stop = threading.Event()

    def read() -> None:  # as journald does: always reading, so the socket's small queue never fills
        while not stop.is_set():
            try:
                got.append(parse(sock.recv(1 << 16)))
            except TimeoutError:
                continue

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    s = sim("ok", args={"model-path": "https://hf:s3cr3t-value-9@models.example/llama"})
    s = s.model_copy(
        update={
            "logs": s.logs.model_copy(
                update={"journal": True, "journal_socket": str(path), "journal_identifier": "sglang-a"}
            )
        }
    )
    ready_line = "The server is fired up and ready to roll!"
    try:
        r = await daemon(s)
        await r.wait_for(lambda x: x.state == "ready", 30, "ready")
        for _ in range(100):  # the ready line follows the warm-up request: it may come after `ready`
            if any(ready_line in g["MESSAGE"].decode(errors="replace") for g in list(got)):
                break
            await asyncio.sleep(0.1)
        messages = [g["MESSAGE"].decode(errors="replace") for g in got]
        assert any("server_args=ServerArgs(" in m for m in messages), [m[:80] for m in messages]
        assert not any("s3cr3t-value-9" in m for m in messages)  # the server echoes it; the journal does not
        assert any("hf:[redacted]@models.example" in m for m in messages)
        assert any("The server is fired up and ready to roll!" in m for m in messages)
        assert {g["SYSLOG_IDENTIFIER"] for g in got} == {b"sglang-a"}
        log = (Path(s.paths.state_dir) / "logs" / "server.log").read_text(errors="replace")
        assert "The server is fired up and ready to roll!" in log  # the file stays the full record
    finally:
        stop.set()
        reader.join(5)
        sock.close()


async def test_off_by_default(daemon, sim) -> None:  # type: ignore[no-untyped-def]
    s = sim("ok")
    assert s.logs.journal is False
    r = await daemon(s)
    await r.wait_for(lambda x: x.state == "ready", 30, "ready")
    keeper = r.snap().log_keeper
    assert keeper is not None and keeper.pid is not None
    argv = Path(f"/proc/{keeper.pid}/cmdline").read_bytes().split(b"\0")
    assert b"--journal-socket" not in argv and b"--journal-id" not in argv, argv
