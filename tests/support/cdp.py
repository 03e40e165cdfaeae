"""Drive a real headless Chromium through the DevTools protocol, with no client library: a
websocket (RFC 6455, text frames only) over a plain socket, one page, `call(method, **params)`.

Enough for the page tests: navigate, wait for the load, evaluate an expression in the page (as a
person's typing and clicking would, through the DOM) and read back a value."""

from __future__ import annotations

import base64
import json
import os
import re
import socket
import struct
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any


class Chromium:
    def __init__(self, profile: Path, binary: str = "chromium") -> None:
        profile.mkdir(parents=True, exist_ok=True)
        self.log = profile / "chromium.log"  # a file, not a pipe: nobody need keep reading it
        with open(self.log, "wb") as err:
            self.proc = subprocess.Popen(
                [
                    binary, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--hide-scrollbars",
                    "--remote-debugging-port=0", f"--user-data-dir={profile}", "--window-size=1200,1400",
                    "--force-device-scale-factor=1", "about:blank",
                ],
                stdout=subprocess.DEVNULL,
                stderr=err,
            )  # fmt: skip
        port = None
        deadline = time.monotonic() + 60
        while port is None and time.monotonic() < deadline:
            m = re.search(r"DevTools listening on ws://127\.0\.0\.1:(\d+)/", self.log.read_text(errors="replace"))
            if m:
                port = int(m[1])
            elif self.proc.poll() is not None:
                raise RuntimeError(f"chromium exited before it listened: {self.log.read_text()[-2000:]}")
            else:
                time.sleep(0.1)
        assert port is not None, "chromium never said where DevTools listens"
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=30) as answer:
            targets = json.loads(answer.read())
        page = next(t for t in targets if t["type"] == "page")
        self.ws = _WebSocket(page["webSocketDebuggerUrl"])
        self._id = 0
        self.events: list[dict[str, Any]] = []
        self.call("Page.enable")

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        self._id += 1
        self.ws.send(json.dumps({"id": self._id, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == self._id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})  # type: ignore[no-any-return]
            self.events.append(msg)

    def wait_event(self, method: str, timeout: float = 60) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for i, ev in enumerate(self.events):
                if ev.get("method") == method:
                    return self.events.pop(i)
            self.ws.sock.settimeout(max(0.1, deadline - time.monotonic()))
            self.events.append(json.loads(self.ws.recv()))
        raise AssertionError(f"no {method} in {timeout} s")

    def goto(self, url: str) -> None:
        self.events.clear()
        self.call("Page.navigate", url=url)
        self.wait_event("Page.loadEventFired")

    def js(self, expression: str) -> Any:
        out = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in out:
            raise AssertionError(f"{expression}: {out['exceptionDetails']}")
        return out["result"].get("value")

    def submit(self, expression: str) -> None:
        """Click (or submit) through `expression`, then wait for the page it leads to."""
        self.events.clear()
        self.js(expression)
        self.wait_event("Page.loadEventFired")

    def close(self) -> None:
        try:
            self.ws.sock.close()
        finally:
            self.proc.kill()
            self.proc.wait(timeout=30)


class _WebSocket:
    def __init__(self, url: str) -> None:
        m = re.match(r"ws://([^/:]+):(\d+)(/.*)", url)
        assert m is not None, url
        self.sock = socket.create_connection((m[1], int(m[2])), timeout=60)
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall(
            (
                f"GET {m[3]} HTTP/1.1\r\nHost: {m[1]}:{m[2]}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
            ).encode()
        )
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = self.sock.recv(4096)
            assert chunk, "the websocket closed during the handshake"
            head += chunk
        assert head.startswith(b"HTTP/1.1 101"), head[:200]
        self.buf = head.split(b"\r\n\r\n", 1)[1]

    def send(self, text: str) -> None:
        data = text.encode()
        mask = os.urandom(4)
        n = len(data)
        header = bytes([0x81]) + (
            bytes([0x80 | n]) if n < 126 else bytes([0x80 | 126]) + struct.pack(">H", n)
            if n < 65536 else bytes([0x80 | 127]) + struct.pack(">Q", n)
        )  # fmt: skip
        self.sock.sendall(header + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(data)))

    def _read(self, n: int) -> bytes:
        while len(self.buf) < n:
            chunk = self.sock.recv(1 << 16)
            assert chunk, "the websocket closed"
            self.buf += chunk
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def recv(self) -> str:
        message = b""
        while True:
            b0, b1 = self._read(2)
            n = b1 & 0x7F
            if n == 126:
                n = struct.unpack(">H", self._read(2))[0]
            elif n == 127:
                n = struct.unpack(">Q", self._read(8))[0]
            payload = self._read(n)
            message += payload
            if b0 & 0x80:  # FIN
                return message.decode()
