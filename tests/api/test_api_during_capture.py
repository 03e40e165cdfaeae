"""/status and /metrics keep answering while gdb and py-spy hold a real deadlocked process.

The capture runs on the API's own event loop, as it does in the daemon (one loop hosts uvicorn and
the supervisor task), through subprocesses; the routes must not wait for it.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import uvicorn
from fake_supervisor import FakeSupervisor, attach
from prometheus_client import CollectorRegistry

from api.app import create_app
from supervisor.metrics.exporter import SupervisorMetrics
from supervisor.status.commands import CommandResult
from supervisor.status.journal import Journal

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(shutil.which("gdb") is None, reason="gdb not installed"),
]

DEADLOCK = """
import threading, time, sys
a, b = threading.Lock(), threading.Lock()
both = threading.Barrier(2)
def one():
    with a:
        both.wait(); b.acquire()
def two():
    with b:
        both.wait(); a.acquire()
for f in (one, two):
    threading.Thread(target=f, daemon=True).start()
time.sleep(0.3)
print("ready", flush=True)
threading.Event().wait()
"""


class GdbCapturingSupervisor(FakeSupervisor):
    """Diagnoses by attaching gdb (then py-spy) to a real hung process, as the daemon's capture does."""

    def __init__(self, pid: int) -> None:
        super().__init__()
        self.pid = pid
        self.capture_s = 0.0

    async def _diagnose(self) -> CommandResult:
        if self.diagnosing:
            return CommandResult("busy", "a capture is under way", state="diagnosing")
        self.diagnosing = True
        t0 = time.monotonic()
        try:
            outputs = []
            argvs = [["gdb", "-nx", "-batch", "-p", str(self.pid), "-ex", "thread apply all bt"]]
            spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
            if os.path.exists(spy):
                argvs.append([spy, "dump", "--pid", str(self.pid)])
            for argv in argvs:
                proc = await asyncio.create_subprocess_exec(
                    *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
                )
                out, _ = await asyncio.wait_for(proc.communicate(), 60)
                outputs.append(out.decode(errors="replace"))
            self.capture_s = time.monotonic() - t0
            return CommandResult("done", bundle_id="real-capture", summary={"bytes": sum(map(len, outputs))})
        finally:
            self.diagnosing = False


@pytest.fixture
def hung_process() -> Iterator[subprocess.Popen[str]]:
    proc = subprocess.Popen([sys.executable, "-c", DEADLOCK], stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"
        yield proc
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
        if proc.stdout is not None:
            proc.stdout.close()


def test_status_and_metrics_answer_during_a_gdb_capture(hung_process: subprocess.Popen[str], tmp_path: Path) -> None:
    handle = GdbCapturingSupervisor(hung_process.pid)
    registry = CollectorRegistry()
    SupervisorMetrics(registry, handle.snapshot)
    app = attach(
        create_app(
            None,
            token=None,
            diag_dir=tmp_path,
            journal=Journal(tmp_path / "events.jsonl"),
            registry=registry,
            max_body_bytes=65536,
        ),
        handle,
    )
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)  # proto 6: asyncio sets TCP_NODELAY
    sock.bind(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    server = uvicorn.Server(uvicorn.Config(app, lifespan="off", log_config=None, access_log=False, ws="none"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while not server.started and time.monotonic() < deadline:
            time.sleep(0.01)
        result: dict[str, httpx.Response] = {}

        def diagnose() -> None:
            with httpx.Client(base_url=url, timeout=120) as c:
                result["diagnose"] = c.post("/diagnose", json={"gdb": True})

        capture = threading.Thread(target=diagnose)
        capture.start()
        latencies: dict[str, list[float]] = {"/status": [], "/metrics": []}
        with httpx.Client(base_url=url, timeout=10) as c:
            while not handle.diagnosing and capture.is_alive():
                time.sleep(0.005)
            while capture.is_alive():
                for path, seen in latencies.items():
                    t0 = time.perf_counter()
                    assert c.get(path).status_code == 200
                    seen.append(time.perf_counter() - t0)
                time.sleep(0.02)
        capture.join()
        assert result["diagnose"].status_code == 200, result["diagnose"].text
        assert result["diagnose"].json()["summary"]["bytes"] > 0
        for path, seen in latencies.items():
            assert seen, f"no {path} request landed during the {handle.capture_s:.2f} s capture"
            # 2 s, as every blow-up guard here (DECISIONS, "Tests that hold on a loaded CI machine"): a
            # route blocked by the capture waits seconds; 1 s was missed once under six parallel workers.
            assert max(seen) < 2.0, (path, max(seen))
            print(
                f"{path} during a {handle.capture_s:.2f} s gdb+py-spy capture: n={len(seen)} "
                f"p50={1000 * statistics.median(seen):.1f} ms max={1000 * max(seen):.1f} ms"
            )
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()
