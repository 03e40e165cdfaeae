"""`sglang-supervisor bundles get` against an answering side that lies (issue 50): the real CLI (a
child process) against a fake daemon on a real socket that names `../../x`, absolute paths and
other non-names, redirects elsewhere, or finds a symlink planted where the bundle goes.

Before the fix the names from the answer were joined to `./ID/` and written wherever they pointed
(with the token sent for each), and a dangling symlink in `./ID/` was followed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from supervisor.client.savefiles import plain_name

TOKEN = "bundles-get-hostile-token-0123"
ROOT = Path(__file__).resolve().parents[3]

Answer = tuple[int, dict[str, str], bytes]


@dataclass
class Fake:
    """A real HTTP server; `answer(path)` says what it answers; every request is recorded."""

    answer: Callable[[str], Answer]
    seen: list[tuple[str, str | None]] = field(default_factory=list)  # (path, Authorization)
    url: str = ""


def _serve(fake: Fake) -> tuple[ThreadingHTTPServer, threading.Thread]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            fake.seen.append((self.path, self.headers.get("Authorization")))
            status, headers, body = fake.answer(self.path)
            self.send_response(status)
            for k, v in {"Content-Type": "application/json", **headers}.items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    fake.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    return server, thread


@pytest.fixture
def serve() -> Iterator[Callable[[Callable[[str], Answer]], Fake]]:
    running: list[tuple[ThreadingHTTPServer, threading.Thread]] = []

    def start(answer: Callable[[str], Answer]) -> Fake:
        fake = Fake(answer)
        running.append(_serve(fake))
        return fake

    yield start
    for server, thread in running:
        server.shutdown()
        server.server_close()
        thread.join(10)


def listing(*files: str) -> Callable[[str], Answer]:
    """A daemon whose bundle B lists `files` and serves each file's name as its content."""

    def answer(path: str) -> Answer:
        if path == "/diagnostics/B":
            return 200, {}, json.dumps({"id": "B", "files": list(files)}).encode()
        return 200, {"Content-Type": "text/plain"}, f"content of {path}".encode()

    return answer


def cli(cwd: Path, url: str, *words: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SGLANG_SUPERVISOR_TOKEN": TOKEN, "PYTHONPATH": str(ROOT)}
    env.pop("SGLANG_SUPERVISOR_CONFIG", None)
    return subprocess.run(
        [sys.executable, "-m", "supervisor", "bundles", "--url", url, "get", *words],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def everything_under(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


@pytest.mark.parametrize(
    "hostile",
    ["../../x", "../escaped", "/tmp/absolute-from-the-wire", "sub/dir.txt", "..", ".", "nul\x00byte", "", "a\\b"],
)
def test_a_name_from_the_wire_that_is_not_a_plain_name_writes_nothing_and_fetches_nothing(
    serve: Callable[[Callable[[str], Answer]], Fake], tmp_path: Path, hostile: str
) -> None:
    here = tmp_path / "a" / "b" / "here"
    here.mkdir(parents=True)
    fake = serve(listing("summary.txt", hostile))
    got = cli(here, fake.url, "B")
    assert got.returncode == 1, (got.returncode, got.stdout, got.stderr)
    assert "not a plain file name; nothing written" in got.stderr, got.stderr
    assert "Traceback" not in got.stderr
    assert everything_under(tmp_path) == {"a", "a/b", "a/b/here"}, "nothing written anywhere"
    assert not Path("/tmp/absolute-from-the-wire").exists()
    assert [p for p, _ in fake.seen] == ["/diagnostics/B"], "no file of the bundle was asked for"


def test_plain_bundle_downloads_into_a_directory_it_creates(
    serve: Callable[[Callable[[str], Answer]], Fake], tmp_path: Path
) -> None:
    fake = serve(listing("summary.txt", "pyspy-4242.txt"))
    got = cli(tmp_path, fake.url, "B")
    assert got.returncode == 0, got.stderr
    assert (tmp_path / "B" / "pyspy-4242.txt").read_text() == "content of /diagnostics/B/pyspy-4242.txt"
    assert oct((tmp_path / "B").stat().st_mode & 0o777) == oct(0o700)
    assert all(auth == f"Bearer {TOKEN}" for _, auth in fake.seen)


def test_a_directory_with_a_planted_dangling_symlink_is_not_written_into(
    serve: Callable[[Callable[[str], Answer]], Fake], tmp_path: Path
) -> None:
    victim = tmp_path / "victim.txt"
    (tmp_path / "B").mkdir()
    (tmp_path / "B" / "summary.txt").symlink_to(victim)  # dangling: `exists()` is False for it
    fake = serve(listing("summary.txt"))
    got = cli(tmp_path, fake.url, "B")
    assert got.returncode == 1 and "exists; not overwritten" in got.stderr, got.stderr
    assert not victim.exists()


def test_one_file_onto_a_dangling_symlink_is_refused(
    serve: Callable[[Callable[[str], Answer]], Fake], tmp_path: Path
) -> None:
    victim = tmp_path / "victim.txt"
    (tmp_path / "summary.txt").symlink_to(victim)
    fake = serve(listing("summary.txt"))
    got = cli(tmp_path, fake.url, "B", "summary.txt")
    assert got.returncode == 1 and "exists; not overwritten" in got.stderr, got.stderr
    assert not victim.exists()


def test_a_redirect_is_not_followed_and_the_token_goes_nowhere_else(
    serve: Callable[[Callable[[str], Answer]], Fake], tmp_path: Path
) -> None:
    elsewhere = serve(listing("summary.txt"))
    for where in ("/diagnostics/B", "/diagnostics/B/summary.txt"):

        def answer(path: str, where: str = where) -> Answer:
            if path == where:
                return 302, {"Location": f"{elsewhere.url}{path}"}, b"{}"
            return listing("summary.txt")(path)

        fake = serve(answer)
        target = tmp_path / where.replace("/", "_")
        target.mkdir()
        got = cli(target, fake.url, "B")
        assert got.returncode == 1, (got.stdout, got.stderr)
        assert "redirect (302)" in got.stderr and "not followed" in got.stderr, got.stderr
        assert TOKEN not in got.stderr + got.stdout
    assert elsewhere.seen == [], "the other address received nothing (and no token)"


def test_the_bundle_id_from_the_command_line_must_be_a_name_too(
    serve: Callable[[Callable[[str], Answer]], Fake], tmp_path: Path
) -> None:
    fake = serve(listing("summary.txt"))
    got = cli(tmp_path, fake.url, "../B")
    assert got.returncode == 2 and "is not a bundle or file name" in got.stderr, got.stderr
    assert fake.seen == []


def test_plain_name() -> None:
    assert plain_name("pyspy-4242.txt") and plain_name("summary.json") and plain_name("...x")
    for bad in ("", ".", "..", "a/b", "/abs", "a\\b", "x\x00", "x\n", "x\x7f", "é" * 200, None, 3, ["a"]):
        assert not plain_name(bad), bad
