"""A serving server whose port stops accepting becomes `unhealthy` after `health_failures`."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.integration

# Serves /health, then closes its listening socket after CLOSE_AFTER_S and lives on, silent.
SERVER = r"""
import http.server, os, sys, threading, time
port = int(sys.argv[sys.argv.index("--port") + 1])
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.send_header("Content-Length", "0")
        self.end_headers()
    def log_message(self, *a):
        pass
srv = http.server.ThreadingHTTPServer(("127.0.0.1", port), H)
threading.Thread(target=srv.serve_forever, daemon=True).start()
print("The server is fired up and ready to roll!", flush=True)
time.sleep(float(os.environ["CLOSE_AFTER_S"]))
srv.shutdown()
srv.server_close()
print("listening socket closed", flush=True)
time.sleep(3600)
"""


async def test_port_that_stops_accepting_is_unhealthy(daemon, sim, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    script = tmp_path / "server.py"
    script.write_text(SERVER)
    s = sim("ok", tp=1, watchdog={"health_failures": 2, "health_interval_s": 0.5, "serving_stall_s": 60.0})
    server = s.server.model_copy(
        update={"command": (sys.executable, str(script)), "args": {}, "env": {"CLOSE_AFTER_S": "3"}}
    )
    s = s.model_copy(update={"server": server})
    r = await daemon(s)
    await r.wait_for(lambda x: x.state == "ready", 30, "ready")
    snap: Any = await r.wait_for(lambda x: x.last_incident is not None, 30, "an incident once the port closed")
    assert snap.last_incident.cause == "unhealthy", snap.last_incident
    assert "health checks failed" in snap.last_incident.detail
