"""A full disk under state_dir, through the running daemon: write errors counted in /status and
/metrics, state.json and the journal never torn, temporary files removed, the service unharmed."""

from __future__ import annotations

import contextlib
import errno
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from daemonproc import marker_of

pytestmark = pytest.mark.integration


@contextlib.contextmanager
def tiny_disk(path: Path, size: str = "2m") -> Iterator[Path]:
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def fill(path: Path) -> Path:
    filler = path / "filler"
    with open(filler, "wb") as f:
        try:
            while True:
                f.write(b"\0" * 65536)
                f.flush()
        except OSError as err:
            assert err.errno == errno.ENOSPC
    return filler


async def test_full_disk_is_counted_and_survived(daemon, sim, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    s = sim("ok", tp=1)
    with tiny_disk(s.state_dir):
        r = await daemon(s)
        await r.wait_for(lambda x: x.state == "ready", 60, "ready")
        before = (s.state_dir / "state.json").read_text()
        filler = fill(s.state_dir)
        async with httpx.AsyncClient(timeout=30) as c:
            # The journal's last page may still hold a few lines: restart until it is full too.
            for _ in range(6):
                first = r.snap().pid
                assert (await c.post(f"{r.api}/restart", json={})).status_code == 202
                snap = await r.wait_for(
                    lambda x, old=first: x.state == "ready" and x.pid != old, 60, "ready on a full disk"
                )
                if snap.write_errors.journal > 0:
                    break
            assert snap.write_errors.journal > 0 and snap.write_errors.state > 0, snap.write_errors
            assert snap.write_errors.server_log > 0, snap.write_errors
            status = (await c.get(f"{r.api}/status")).json()
            assert status["write_errors"]["journal"] > 0
            # An evidence bundle cannot be written either: a warning, no half-written bundle left.
            diag = (await c.post(f"{r.api}/diagnose", json={})).json()
            assert diag["bundle_id"] is None and diag["message"], diag
            assert r.snap().write_errors.bundle >= 1 and r.snap().state == "ready"
            leftovers = (
                list((s.state_dir / "diagnostics").glob(".tmp-*")) if (s.state_dir / "diagnostics").exists() else []
            )
            assert leftovers == [], "the temporary bundle directory was removed"
            metrics = (await c.get(f"{r.api}/metrics")).text
            # One source: /status and /metrics count the server log's failed writes alike, across
            # the keepers of every launch (each starts its stats file at 0).
            for _ in range(20):
                status = (await c.get(f"{r.api}/status")).json()
                text = (await c.get(f"{r.api}/metrics")).text
                counted = [
                    float(x.rsplit(" ", 1)[1])
                    for x in text.splitlines()
                    if x.startswith('sglang_supervisor_write_errors_total{file="server_log"}')
                ]
                if counted == [float(status["write_errors"]["server_log"])]:
                    break
            assert counted == [float(status["write_errors"]["server_log"])], (counted, status["write_errors"])
        journal_errors = [
            float(x.rsplit(" ", 1)[1])
            for x in metrics.splitlines()
            if x.startswith('sglang_supervisor_write_errors_total{file="journal"}')
        ]
        assert journal_errors and journal_errors[0] > 0
        assert (s.state_dir / "state.json").read_text() == before, "the old state.json stays whole"
        assert not [p.name for p in s.state_dir.iterdir() if p.name.endswith(".tmp")], "no temporary left"
        filler.unlink()
        async with httpx.AsyncClient(timeout=30) as c:
            assert (await c.post(f"{r.api}/restart", json={})).status_code == 202
        await r.wait_for(lambda x: x.state == "ready" and x.pid != snap.pid, 60, "ready with space again")
        lines = (s.state_dir / "events.jsonl").read_text().splitlines()
        assert all(json.loads(x) for x in lines), "every journal line is whole"
        assert json.loads((s.state_dir / "state.json").read_text())["marker"] == marker_of(r.snap().pid)
        await r.stop()
