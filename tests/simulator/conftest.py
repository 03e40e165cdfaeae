"""Run the simulator as the supervisor does (own session, marker variable) and always clean it up."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest
import waiting
from freeport import free_port

ROOT = Path(__file__).resolve().parents[2]
MARKER_ENV = "SGLANG_SUPERVISOR_MARKER"
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def wait_for(cond: Callable[[], object], timeout: float, interval: float = 0.05) -> bool:
    return waiting.wait_for(cond, timeout, interval)


def marked(marker: str) -> list[psutil.Process]:
    """Every live process whose environment carries the marker (zombies excluded)."""
    found = []
    needle = f"{MARKER_ENV}={marker}".encode()
    for pid in psutil.pids():
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if needle not in f.read().split(b"\0"):
                    continue
            proc = psutil.Process(pid)
            if proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except (OSError, psutil.Error):
            continue
    return found


@dataclass
class Sim:
    proc: subprocess.Popen[bytes]
    port: int
    marker: str
    err_path: Path
    out_path: Path
    onset_path: Path
    started: float = field(default_factory=time.monotonic)

    def stderr(self) -> str:
        return self.err_path.read_bytes().decode("utf-8", "replace")

    def stdout(self) -> str:
        return self.out_path.read_bytes().decode("utf-8", "replace")

    def output(self) -> str:
        """Both streams (vLLM logs on stdout, its bars and Python's tracebacks go to stderr)."""
        return self.stdout() + self.stderr()

    def wait_out(self, text: str, timeout: float = 20.0, count: int = 1) -> bool:
        return wait_for(lambda: self.output().count(text) >= count, timeout)

    @staticmethod
    def wait_until(cond: Callable[[], object], timeout: float = 10.0) -> bool:
        return wait_for(cond, timeout)

    def wait_log(self, text: str, timeout: float = 20.0, count: int = 1) -> bool:
        return wait_for(lambda: self.stderr().count(text) >= count, timeout)

    def accepts(self) -> bool:
        with socket.socket() as s:
            s.settimeout(0.5)
            return s.connect_ex(("127.0.0.1", self.port)) == 0

    def request(self, path: str, body: object = None, timeout: float = 10.0) -> tuple[int, bytes]:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", data=data)
        try:
            with _OPENER.open(req, timeout=timeout) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    def generate(self, max_new_tokens: int = 16, timeout: float = 10.0) -> tuple[int, bytes]:
        body = {"text": "hi there", "sampling_params": {"max_new_tokens": max_new_tokens}}
        return self.request("/generate", body, timeout)

    def metrics(self) -> dict[str, float]:
        """The first sample of each metric name (labels dropped)."""
        status, body = self.request("/metrics")
        assert status == 200
        out: dict[str, float] = {}
        for line in body.decode().splitlines():
            if line and not line.startswith("#"):
                name = line.split("{", 1)[0].split(" ", 1)[0]
                if name == "sglang:realtime_tokens_total" and 'mode="decode"' not in line:
                    continue
                out.setdefault(name, float(line.rsplit(" ", 1)[1]))
        return out

    def children(self) -> list[psutil.Process]:
        try:
            return psutil.Process(self.proc.pid).children()
        except psutil.Error:
            return []

    def marked(self) -> list[psutil.Process]:
        return marked(self.marker)

    def schedulers(self) -> list[psutil.Process]:
        out = []
        for child in self.children():
            try:
                if child.cmdline()[:1] and child.cmdline()[0].startswith("sglang::scheduler"):
                    out.append(child)
            except psutil.Error:
                continue
        return sorted(out, key=lambda p: p.cmdline()[0])

    def onset(self) -> dict[str, object]:
        data: dict[str, object] = json.loads(self.onset_path.read_text())
        return data


SimStarter = Callable[..., Sim]


ArgvFor = Callable[[int, int, tuple[str, ...]], list[str]]


def _sglang_argv(port: int, tp: int, flags: tuple[str, ...]) -> list[str]:
    argv = [sys.executable, "-m", "supervisor.simulator", "--model-path", "/models/sim", "--tp-size", str(tp)]
    return [*argv, "--host", "127.0.0.1", "--port", str(port), *flags]


def _vllm_argv(port: int, tp: int, flags: tuple[str, ...]) -> list[str]:
    """As the daemon launches a vLLM rung: the simulator's `--engine vllm`, then `vllm serve`'s flags."""
    argv = [sys.executable, "-m", "supervisor.simulator", "--engine", "vllm", "--model", "/models/sim"]
    return [*argv, "--tensor-parallel-size", str(tp), *flags, "--host", "127.0.0.1", "--port", str(port)]


def _starter(tmp_path: Path, argv_for: ArgvFor) -> Iterator[SimStarter]:
    marker = f"simtest-{uuid.uuid4().hex[:12]}"
    started: list[Sim] = []

    def start(scenario: str = "ok", *flags: str, tp: int = 2, env: dict[str, str] | None = None) -> Sim:
        n = len(started)
        port = free_port()
        onset = tmp_path / f"onset-{n}.json"
        full_env = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            MARKER_ENV: marker,
            "SPT_NOENV": "1",  # as the supervisor: setproctitle must not clobber the marker
            "SGLANG_SIM_SCENARIO": scenario,
            "SGLANG_SIM_PACE": "0.2",
            "SGLANG_SIM_HEALTH_LATENCY_S": "0.05",
            "SGLANG_SIM_ONSET_FILE": str(onset),
            **(env or {}),
        }
        argv = argv_for(port, tp, flags)
        err, out = tmp_path / f"stderr-{n}.log", tmp_path / f"stdout-{n}.log"
        with open(err, "wb") as ferr, open(out, "wb") as fout:
            proc = subprocess.Popen(
                argv, env=full_env, cwd=ROOT, stdin=subprocess.DEVNULL, stdout=fout, stderr=ferr, start_new_session=True
            )
        s = Sim(proc, port, marker, err, out, onset)
        started.append(s)
        return s

    yield start
    for s in started:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(s.proc.pid, signal.SIGKILL)
    for _ in range(100):
        left = marked(marker)
        if not left:
            break
        for proc in left:
            with contextlib.suppress(psutil.Error):
                proc.kill()
        time.sleep(0.05)
    for s in started:
        s.proc.wait(5)


@pytest.fixture
def sim(tmp_path: Path) -> Iterator[SimStarter]:
    """`sim(scenario, *flags, tp=2, env={...})`: start the simulator at pace 0.2 on a free port."""
    yield from _starter(tmp_path, _sglang_argv)


@pytest.fixture
def vsim(tmp_path: Path) -> Iterator[SimStarter]:
    """`vsim(scenario, *flags, tp=2, env={...})`: the simulator's vLLM mode, the same way."""
    yield from _starter(tmp_path, _vllm_argv)
