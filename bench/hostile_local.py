"""Hostile rows of issue 50 that are not a flood of API clients: what a local user can do from beside
the daemon (bench/hostile.py renders them with the others).

  bundles_get_traversal  the real CLI `sglang-supervisor bundles get ID` against a fake daemon (an
                         http.server in a thread) that lists `../../x` and absolute names, or
                         redirects a download to another port, or finds a dangling symlink planted at
                         `./ID`: files written outside `./ID`, and the token sent to the other port
  state_file_nan         FIFOs named `launches.json` and `state.json` in the state directory before
                         the start (seconds to `/livez` and to ready), then `NaN`, `inf`, 1e308 and
                         negative quiet intervals written into the book a good start left: the
                         start-up stall window `/status` shows against the configured one
  cookie_other_port      log in to `/ui/login` with the token, take the cookie, and post the page's
                         `stop` form with it from another loopback port (a relay that forwards with
                         its own Host and Origin), with another port's Origin, and with another
                         port's Host: state-changing requests accepted
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx

LOCAL_ATTACKS = ("bundles_get_traversal", "state_file_nan", "cookie_other_port")
CLI_TOKEN = "hostile-bundles-get-token-" + "b" * 16
COOKIE_TOKEN = "hostile-cookie-ports-token-" + "c" * 16

Answer = tuple[int, dict[str, str], bytes]


@dataclass
class FakeServer:
    """A real HTTP server on loopback: `answer(method, path, headers, body)` says what it answers;
    every request is recorded as (method, path, headers)."""

    answer: Callable[[str, str, dict[str, str], bytes], Answer]
    seen: list[tuple[str, str, dict[str, str]]] = field(default_factory=list)
    url: str = ""
    port: int = 0
    _server: ThreadingHTTPServer | None = None

    def __enter__(self) -> FakeServer:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def _any(self) -> None:
                headers = {k.lower(): v for k, v in self.headers.items()}
                size = int(headers.get("content-length", "0") or 0)
                body = self.rfile.read(size) if size else b""
                fake.seen.append((self.command, self.path, headers))
                status, extra, out = fake.answer(self.command, self.path, headers, body)
                self.send_response(status)
                for k, v in {"Content-Type": "application/json", **extra}.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            do_GET = do_POST = _any

            def log_message(self, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = int(self._server.server_address[1])
        self.url = f"http://127.0.0.1:{self.port}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def token_requests(self, token: str) -> int:
        return sum(1 for _, _, h in self.seen if token in h.get("authorization", ""))


# ---- bundles get against a lying answering side -------------------------------------------------


def _cli(cwd: Path, url: str, *words: str) -> subprocess.CompletedProcess[str]:
    from bench.common import PY, ROOT

    env = {**os.environ, "SGLANG_SUPERVISOR_TOKEN": CLI_TOKEN, "PYTHONPATH": str(ROOT)}
    env.pop("SGLANG_SUPERVISOR_CONFIG", None)
    argv = [PY, "-m", "supervisor", "bundles", "--url", url, "get", *words]
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def _files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() or p.is_symlink()}


def bundles_get_traversal(wd: Path) -> dict[str, Any]:
    """Each lie once, the CLI run in `wd/run/cwd` (`wd` is the sandbox the names aim at): files that
    appeared anywhere in the sandbox outside `./ID`, or at the absolute path named, and requests to the
    other port that carried the token."""
    bundle = "B"
    absolute = Path(f"/tmp/hostile-bundles-get-{os.getpid()}-{time.monotonic_ns()}")
    outside = wd / "outside-target"
    with FakeServer(lambda *_: (200, {}, b"stolen")) as other:
        lies: dict[str, list[str] | None] = {
            "traversal": ["../../x", "../escaped", "summary.txt"],
            "absolute": [str(absolute), "summary.txt"],
            "redirect": ["summary.txt"],
            "symlink_at_id": ["summary.txt"],
        }
        runs: dict[str, int] = {}
        outside_files = 0
        for lie, names in lies.items():
            run = wd / lie / "deep" / "cwd"
            run.mkdir(parents=True)
            if lie == "symlink_at_id":
                (run / bundle).symlink_to(outside)  # dangling: a follow would create the target

            def answer(
                method: str, path: str, headers: dict[str, str], body: bytes, names: Any = names, lie: str = lie
            ) -> Answer:
                if path == f"/diagnostics/{bundle}":
                    return 200, {}, json.dumps({"id": bundle, "files": names}).encode()
                if lie == "redirect":
                    return 307, {"Location": f"{other.url}/steal{path}"}, b""
                return 200, {"Content-Type": "text/plain"}, f"planted by the answering side: {path}\n".encode()

            before = _files(wd)
            with FakeServer(answer) as fake:
                done = _cli(run, fake.url, bundle)
            runs[lie] = done.returncode
            after = _files(wd) - before
            inside = {f for f in after if f.startswith(str((run / bundle).relative_to(wd)) + "/")}
            outside_files += len(after - inside) + int(absolute.exists()) + int(outside.exists())
        token_elsewhere = other.token_requests(CLI_TOKEN)
        other_requests = len(other.seen)
    absolute.unlink(missing_ok=True)
    return {
        "written_outside_id": outside_files,
        "token_to_other_port": token_elsewhere,
        "requests_to_other_port": other_requests,
        "cli_exit": "/".join(str(runs[k]) for k in lies),
    }


# ---- state files planted before the start ------------------------------------------------------


def _until(pred: Callable[[], bool], timeout: float, every: float = 0.1) -> float | None:
    """Seconds until `pred` held, or None after `timeout`."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if pred():
            return time.monotonic() - t0
        time.sleep(every)
    return None


def _livez(api: str) -> bool:
    try:
        return httpx.get(f"{api}/livez", timeout=2, trust_env=False).status_code == 200
    except httpx.HTTPError:
        return False


def _status(api: str) -> dict[str, Any]:
    try:
        data: dict[str, Any] = httpx.get(f"{api}/status", timeout=3, trust_env=False).json()
        return data
    except (httpx.HTTPError, ValueError):
        return {}


def poison(book_path: Path) -> int:
    """Every learned quiet interval of the book replaced by a number that is not a window (NaN, inf,
    1e308, negative, in turn); how many were written."""
    book = json.loads(book_path.read_text())
    bad = [float("nan"), float("inf"), 1e308, -5.0]
    n = 0
    for entry in book.get("entries", {}).values():
        for phase in list(entry.get("quiet_s", {})):
            entry["quiet_s"][phase] = bad[n % len(bad)]
            n += 1
    book_path.write_text(json.dumps(book))
    return n


def state_file_nan(wd: Path, watch: Callable[[str, int], Any], seconds: float) -> dict[str, Any]:
    from bench.common import Daemon, sim_settings
    from supervisor.config.fast import LearnedSettings

    configured = 20.0
    wdog = {"startup_stall_s": configured, "cpu_only_stall_s": 60.0, "startup_timeout_s": 600.0}
    s = sim_settings(wd, "ok", tp=1, watchdog=wdog)
    s = s.model_copy(update={"learned": LearnedSettings(floor_s=3.0, multiple=5.0, min_starts=1)})
    state = s.state_dir
    state.mkdir(parents=True, exist_ok=True)
    for name in ("launches.json", "state.json"):
        os.mkfifo(state / name)
    with Daemon(s, wd) as d:  # FIFOs in place of both state files
        livez_s = _until(lambda: _livez(d.api), 60)
        ready_s = _until(lambda: _status(d.api).get("state") == "ready", 120)
    for name in ("launches.json", "state.json"):
        (state / name).unlink()
    with Daemon(s, wd) as d:  # a good start: the book learns its windows
        _until(lambda: _status(d.api).get("state") == "ready", 120)
    written = poison(state / "launches.json")
    seen: list[dict[str, Any]] = []
    with Daemon(s, wd) as d:  # the start on the poisoned book
        _until(lambda: _livez(d.api), 60)

        def ready() -> bool:
            st = _status(d.api)
            if st.get("stall_window"):
                seen.append(st["stall_window"])
            return st.get("state") == "ready"

        with watch(d.api, d.pid) as w:
            _until(ready, 120, every=0.05)
            time.sleep(min(seconds, 5.0))
        journal = [
            e for e in d.events() if e.get("event") == "launch_book_unreadable" and "malformed" in str(e.get("error"))
        ]
    windows = sorted({(float(x["window_s"]), str(x["source"])) for x in seen})
    in_force = all(math.isfinite(v) and v == configured for v, _ in windows) and bool(windows)
    return {
        "summary": w.summary(),
        "extra": {
            "livez_s_with_fifos": "never" if livez_s is None else round(livez_s, 1),
            "ready_s_with_fifos": "never" if ready_s is None else round(ready_s, 1),
            "quiet_intervals_poisoned": written,
            "window_in_force": ", ".join(f"{v:g} s {src}" for v, src in windows) or "none seen",
            "configured": f"{configured:g} s",
            "equals_configured": "yes" if in_force else "NO",
            "journal_dropped": len(journal),
        },
    }


# ---- the session cookie from another port -------------------------------------------------------


def cookie_other_port(api: str, daemon_port: int) -> dict[str, Any]:
    """A logged-in browser's cookie (and the page's CSRF token) in the hands of a service on another
    loopback port: its `stop` posts, each way it can send them; accepted = answered 200 `stop: accepted`."""
    with httpx.Client(base_url=api, timeout=10, trust_env=False, follow_redirects=False) as c:
        login = c.post(
            "/ui/login",
            content=f"token={COOKIE_TOKEN}".encode(),
            headers={"Content-Type": "application/x-www-form-urlencoded"},
        )
        cookie = login.headers.get("set-cookie", "").split(";", 1)[0]
        page = c.get("/ui", headers={"Cookie": cookie}).text
    m = re.search(r"name='csrf' value='([^']+)'", page)
    csrf = m[1] if m else ""
    form = f"action=stop&confirm=yes&csrf={csrf}".encode()

    def post(headers: dict[str, str]) -> httpx.Response:
        with httpx.Client(timeout=10, trust_env=False, follow_redirects=False) as c:
            return c.post(f"{api}/ui/action", content=form, headers=headers)

    def relay(method: str, path: str, headers: dict[str, str], body: bytes) -> Answer:
        # The other service forwards what the browser sent it, as it came (its own Host and Origin).
        kept = {k: v for k, v in headers.items() if k in ("cookie", "host", "origin", "content-type")}
        with httpx.Client(timeout=10, trust_env=False, follow_redirects=False) as c:
            r = c.request(method, f"{api}{path}", content=body, headers=kept)
        return r.status_code, {"Content-Type": "text/html"}, r.content

    answers: dict[str, int] = {}
    accepted = 0
    with FakeServer(relay) as other:
        other_host = f"127.0.0.1:{other.port}"
        base = {"Cookie": cookie, "Content-Type": "application/x-www-form-urlencoded"}
        tries = {
            "relayed": lambda: httpx.post(
                f"{other.url}/ui/action",
                content=form,
                headers={**base, "Origin": other.url},
                timeout=15,
                trust_env=False,
            ),
            "origin_other_port": lambda: post({**base, "Origin": f"http://127.0.0.1:{other.port}"}),
            "origin_localhost_other_port": lambda: post({**base, "Origin": f"http://localhost:{other.port}"}),
            "host_other_port": lambda: post({**base, "Host": other_host}),
        }
        for name, send in tries.items():
            r = send()
            answers[name] = r.status_code
            accepted += int(r.status_code == 200 and "stop: accepted" in r.text)
    # The control: the same cookie and CSRF token on the API's own origin open the page's confirmation
    # (the form's first step, which changes nothing), so the refusals above are the port's doing.
    unconfirmed = f"action=stop&csrf={csrf}".encode()
    with httpx.Client(timeout=10, trust_env=False, follow_redirects=False) as c:
        own = c.post(f"{api}/ui/action", content=unconfirmed, headers={**base, "Origin": api})
    after = httpx.get(f"{api}/readyz", timeout=5, trust_env=False)
    state = after.json().get("state") if after.status_code in (200, 503) else None
    return {
        "logged_in": "yes" if cookie.startswith("sgs_session=") and csrf else "NO",
        "state_changing_accepted": accepted,
        "answers": "/".join(str(answers[k]) for k in tries),
        "same_origin_control": own.status_code,
        "state_after": state,
    }
