"""Shared by the CPU benchmarks: the windows they run with, simulator configs, the daemon as a real
subprocess, the journal and the simulator's onset side file, a bounded load generator, statistics.

The daemon never reads the onset file: only the benchmark does, to know when a fault really began.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench.report import machine, stamp, versions, write_section
from supervisor import __version__
from supervisor.common.waiting import wait_for
from supervisor.config.render import dump_toml as to_toml
from supervisor.config.settings import Settings, settings_from_mapping
from supervisor.process import kill_marked
from supervisor.simulator import daemonconfig
from supervisor.simulator.daemonconfig import SimWindows

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable
OUT = Path(os.environ.get("SGLANG_BENCH_OUT", "/tmp/sglang-supervisor-bench"))
RESULTS = OUT / "results"
SPEC_ARGS: dict[str, Any] = {"speculative-algorithm": "EAGLE3", "speculative-draft-model-path": "/models/draft"}


@dataclass(frozen=True, kw_only=True)
class Windows(SimWindows):
    """Short windows, so the suite runs in minutes; production defaults are minutes long."""

    poll_s: float = 0.5
    startup_stall_s: float = 4.0
    startup_timeout_s: float = 600.0
    cpu_only_stall_s: float = 8.0
    health_interval_s: float = 1.0
    health_timeout_s: float = 4.0
    health_failures: int = 2
    serving_stall_s: float = 4.0
    metrics_interval_s: float = 0.5  # as poll_s
    spec_window_s: float = 4.0
    backoff_initial_s: float = 0.2
    backoff_max_s: float = 1.0
    max_restarts_per_hour: int = 100
    stop_grace_s: float = 3.0
    release_timeout_s: float = 2.0
    py_spy_timeout_s: float = 10.0
    pace: float = 0.2  # simulator: 0.2 x SGLang's start-up pauses
    # simulator: a serving fault begins this long after its ready line (the daemon's ready needs a
    # health answer too, a poll or two later)
    fault_after_s: float = 2.5
    sglang_health_timeout_s: float = 2.0  # simulator: SGLANG_HEALTH_CHECK_TIMEOUT (20 s in SGLang)
    health_latency_s: float = 0.05  # simulator: a healthy /health answers after this long
    idle_metrics_s: float = 1.5  # simulator: idle gauges republished this often (30 s in SGLang)

    @property
    def health_window_s(self) -> float:
        """`health_failures` probes, each taking at most the timeout and starting an interval apart."""
        return self.health_failures * max(self.health_interval_s, self.health_timeout_s)

    def describe(self) -> str:
        return (
            f"poll {self.poll_s:g} s, startup_stall_s {self.startup_stall_s:g}, cpu_only_stall_s "
            f"{self.cpu_only_stall_s:g}, health every {self.health_interval_s:g} s (timeout "
            f"{self.health_timeout_s:g} s, {self.health_failures} failures), serving_stall_s "
            f"{self.serving_stall_s:g}, spec_window_s {self.spec_window_s:g}, stop_grace_s {self.stop_grace_s:g}; "
            f"simulator pace {self.pace:g}, SGLANG_HEALTH_CHECK_TIMEOUT {self.sglang_health_timeout_s:g} s"
        )


W = Windows()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def workdir(name: str) -> Path:
    """A fresh directory under the output folder for one run."""
    base = OUT / "runs"
    base.mkdir(parents=True, exist_ok=True)
    path = base / f"{name}-{time.strftime('%H%M%S')}-{os.getpid()}-{time.monotonic_ns() % 100000}"
    path.mkdir(parents=True)
    return path


def sim_env(scenario: str, w: Windows = W, **extra: str) -> dict[str, str]:
    return daemonconfig.sim_env(scenario, w, extra=extra)


def sim_settings(
    wd: Path,
    scenario: str,
    *,
    w: Windows = W,
    tp: int = 2,
    env: dict[str, str] | None = None,
    args: dict[str, Any] | None = None,
    fallback: list[dict[str, Any]] | None = None,
    watchdog: dict[str, Any] | None = None,
    restart: dict[str, Any] | None = None,
    diagnostics: dict[str, Any] | None = None,
    gpu_file: Path | None = None,
) -> Settings:
    """The daemon's config for the simulator in `wd`, with the benchmark windows (the product's
    builder, as the tests and the demo use it with theirs). `gpu_file`: the simulated GPU's JSON
    file, read by the daemon (`[gpu] file`) and written by the simulator (`SGLANG_SIM_GPU_FILE`)."""
    data = daemonconfig.sim_config(
        w,
        scenario=scenario,
        state_dir=wd / "state",
        model_path=str(wd / "model"),
        server_port=free_port(),
        api_port=free_port(),
        tp=tp,
        env=env,
        args=args,
        fallback=fallback,
        watchdog=watchdog,
        restart=restart,
        diagnostics=diagnostics,
        gpu_file=gpu_file,
    )
    return settings_from_mapping(data)


def parse_ts(text: str) -> float:
    """A journal `ts` (ISO 8601 UTC, milliseconds) as epoch seconds."""
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


class Daemon:
    """`python -m supervisor run --config FILE` as systemd would run it; SIGTERM stops it."""

    def __init__(self, settings: Settings, wd: Path) -> None:
        self.settings = settings
        self.wd = wd
        self.config = wd / "config.toml"
        self.config.write_text(to_toml(settings))
        self.api = f"http://127.0.0.1:{settings.api.port}"
        self.state_dir = settings.state_dir
        self.proc: subprocess.Popen[bytes] | None = None
        self.leftovers: tuple[int, ...] = ()

    def start(self) -> Daemon:
        log = open(self.wd / "daemon.log", "wb")  # noqa: SIM115 - closed with the process
        self.proc = subprocess.Popen(
            [PY, "-m", "supervisor", "run", "--config", str(self.config), "--log-json"],
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        log.close()
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def status(self) -> dict[str, Any] | None:
        try:
            r = httpx.get(f"{self.api}/status", timeout=3, trust_env=False)
            data: dict[str, Any] = r.json()
            return data
        except (httpx.HTTPError, ValueError):
            return None

    def _alive(self, what: str) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            raise RuntimeError(f"daemon exited {self.proc.returncode} while waiting for {what} ({self.wd})")

    def wait(self, pred: Callable[[dict[str, Any]], bool], timeout: float, what: str) -> dict[str, Any]:
        def read() -> dict[str, Any] | None:
            self._alive(what)
            return self.status()

        return wait_for(read, pred, timeout, what=f"{what} ({self.wd})", show=lambda st: f"status {str(st)[:600]}")

    def events(self) -> list[dict[str, Any]]:
        return read_events(self.state_dir)

    def wait_events(self, pred: Callable[[list[dict[str, Any]]], bool], timeout: float, what: str) -> None:
        def read() -> list[dict[str, Any]]:
            self._alive(what)
            return self.events()

        wait_for(read, pred, timeout, what=f"{what} ({self.wd})", show=lambda ev: f"of {len(ev)} events")

    def stop(self) -> int | None:
        """SIGTERM (the daemon stops its tree), then make sure nothing with its marker is left."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        marker = self.marker()
        if marker:
            self.leftovers = kill_marked(marker, grace_s=0.5).pids_found
        return self.proc.returncode

    def marker(self) -> str | None:
        try:
            value = json.loads((self.state_dir / "state.json").read_text()).get("marker")
        except (OSError, ValueError):
            return None
        return value if isinstance(value, str) else None

    def __enter__(self) -> Daemon:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def read_events(state_dir: Path) -> list[dict[str, Any]]:
    try:
        text = (state_dir / "events.jsonl").read_text()
    except OSError:
        return []
    out: list[dict[str, Any]] = []
    for line in text.splitlines():
        with contextlib.suppress(ValueError):
            out.append(json.loads(line))
    return out


@dataclass(frozen=True)
class Onset:
    pid: int
    wall: float
    monotonic: float
    scenario: str


@dataclass
class OnsetWatcher:
    """Polls the simulator's onset side file and keeps every distinct fault onset (one per launch)."""

    path: Path
    interval_s: float = 0.05
    onsets: list[Onset] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> OnsetWatcher:
        self._thread = threading.Thread(target=self._run, name="onset-watcher", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(2)
        self._poll()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._poll()

    def _poll(self) -> None:
        try:
            rec = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return
        if rec.get("onset_wall") is None:
            return
        onset = Onset(int(rec["pid"]), float(rec["onset_wall"]), float(rec["onset_monotonic"]), str(rec["scenario"]))
        if not any(o.pid == onset.pid and o.monotonic == onset.monotonic for o in self.onsets):
            self.onsets.append(onset)


class Traffic:
    """A bounded /generate load on 127.0.0.1 in its own process (bench/load.py), so the client's
    work never shares an interpreter with what is measured."""

    def __init__(self, port: int, *, concurrency: int = 3, seconds: float = 300.0, tokens: int = 24) -> None:
        self.argv = [
            PY, "-m", "bench.load", "--port", str(port), "--concurrency", str(concurrency),
            "--seconds", str(seconds), "--tokens", str(tokens),
        ]  # fmt: skip
        self.proc: subprocess.Popen[str] | None = None
        self.summary: dict[str, Any] = {}

    def __enter__(self) -> Traffic:
        self.proc = subprocess.Popen(self.argv, cwd=ROOT, stdout=subprocess.PIPE, text=True)
        return self

    def __exit__(self, *exc: object) -> None:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            out, _ = self.proc.communicate(timeout=30)
            self.summary = json.loads(out.strip().splitlines()[-1]) if out.strip() else {}
        except (subprocess.TimeoutExpired, ValueError):
            self.proc.kill()
            self.proc.wait()


# ---- statistics and results -------------------------------------------------------------------


def median(xs: Sequence[float]) -> float:
    return float(statistics.median(xs)) if xs else float("nan")


def percentile(xs: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100)."""
    if not xs:
        return float("nan")
    s = sorted(xs)
    k = max(0, min(len(s) - 1, int(-(-q * len(s) // 100)) - 1))
    return s[k]


def met(ok: bool) -> str:
    return "met" if ok else "NOT met"


def save_result(name: str, data: object) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(data, indent=1, default=str))


def load_result(name: str) -> Any:
    try:
        return json.loads((RESULTS / f"{name}.json").read_text())
    except (OSError, ValueError):
        return None


TOOLS_ARGS = (str(Path(PY).parent / "py-spy"), "/usr/bin/gdb")


def header(title: str, part: str, extra: str = "") -> str:
    lines = [
        f"## {title}",
        "",
        f"Measured {stamp()} on {machine()}; sglang-supervisor {__version__}; {versions(*TOOLS_ARGS)}. "
        "No GPU on this machine (NVML absent). The machine is shared with other test runs, "
        "so timings carry some noise from them.",
        f"Reproduce: `.venv/bin/python -m bench.run_all --only {part}`.",
    ]
    if extra:
        lines += ["", extra]
    return "\n".join(lines) + "\n"


def publish(part: str, body: str) -> None:
    print(body, flush=True)
    write_section(part, body)
