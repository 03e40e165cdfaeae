"""The pieces the real-SGLang scenarios share: the daemon as a real subprocess, driven over its REST
API like an operator would, a status recorder, a load generator, and the server's process tree.

Nothing here reads the daemon's internals: `/status`, `/events`, `/diagnostics` and the process table.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil

from bench.common import free_port
from supervisor.common.waiting import wait_for
from supervisor.config.render import dump_toml
from supervisor.config.settings import settings_from_mapping

__all__ = ["Daemon", "Load", "Recorder", "free_port", "schedulers", "title", "titles"]

ROOT = Path(__file__).resolve().parents[2]
# NVLink multicast stays off on the lent machines (device docs): in every environment we start.
SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
BUSY_STATES = ("hung", "diagnosing", "restarting")


def _state(st: dict[str, Any]) -> str:
    return f"state {st.get('state')} {st.get('reason')}"


class Daemon:
    """`python3 -m supervisor run --config FILE` in its own session, with a client for its API."""

    def __init__(self, work: Path, config: dict[str, Any], env: Mapping[str, str]) -> None:
        self.work = work
        work.mkdir(parents=True, exist_ok=True)
        self.api_port = free_port()
        config.setdefault("api", {})["port"] = self.api_port
        config.setdefault("paths", {})["state_dir"] = str(work / "state")
        self.config = config
        self.config_path = work / "config.toml"
        self.config_path.write_text(dump_toml(settings_from_mapping(config)))  # validated, as `run` reads it
        check = subprocess.run(
            [sys.executable, "-m", "supervisor", "check-config", "--config", str(self.config_path)],
            env=dict(env), cwd=ROOT, capture_output=True, text=True, timeout=120,
        )
        (work / "check-config.txt").write_text(check.stdout + check.stderr)
        self.log = open(work / "daemon.log", "wb")  # noqa: SIM115 - lives as long as the daemon
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "supervisor", "run", "--config", str(self.config_path)],
            env=dict(env), cwd=ROOT, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True,
        )
        self.http = httpx.Client(base_url=f"http://127.0.0.1:{self.api_port}", timeout=10.0)
        self.started = time.time()

    def status(self) -> dict[str, Any]:
        try:
            r = self.http.get("/status")
            return dict(r.json()) if r.status_code == 200 else {}
        except (httpx.HTTPError, ValueError):
            return {}

    def wait(self, pred: Callable[[dict[str, Any]], bool], timeout: float, poll: float = 0.25) -> dict[str, Any]:
        def read() -> dict[str, Any] | None:
            if self.proc.poll() is not None:
                raise RuntimeError(f"daemon exited with {self.proc.returncode}")
            return self.status() or None

        return wait_for(read, pred, timeout, what="match", interval=poll, show=_state)

    def wait_ready(self, timeout: float = 420.0) -> dict[str, Any]:
        return self.wait(lambda s: s.get("state") in ("ready", "degraded"), timeout)

    def wait_incident(self, after: str | None, timeout: float) -> dict[str, Any]:
        """The first /status naming an incident other than `after` (the verdict's moment)."""
        return self.wait(lambda s: (s.get("last_incident") or {}).get("id") not in (None, after), timeout, 0.1)

    def events(self) -> list[dict[str, Any]]:
        try:
            return list(self.http.get("/events", params={"limit": 1000}).json()["events"])
        except (httpx.HTTPError, ValueError, KeyError):
            return []

    def post(self, path: str, body: Mapping[str, Any] | None = None, timeout: float = 30.0) -> dict[str, Any]:
        r = self.http.post(path, json=dict(body or {}), timeout=timeout)
        return {"status_code": r.status_code, **(r.json() if r.content else {})}

    def bundle(self, bundle_id: str) -> dict[str, Any]:
        try:
            doc = self.http.get(f"/diagnostics/{bundle_id}").json()
            txt = self.http.get(f"/diagnostics/{bundle_id}/summary.txt")
            doc["summary_txt"] = txt.text if txt.status_code == 200 else None
            return dict(doc)
        except (httpx.HTTPError, ValueError):
            return {}

    def close(self) -> dict[str, Any]:
        """POST /stop (the server's verified stop), then SIGTERM the daemon."""
        out: dict[str, Any] = {}
        try:
            out["stop"] = self.post("/stop", timeout=120.0)
            self.wait(lambda s: s.get("state") in ("stopped", "failed"), 120.0)
        except Exception as err:
            out["stop_error"] = repr(err)
        out["events"] = self.events()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        out["daemon_exit"] = self.proc.returncode
        self.http.close()
        self.log.close()
        return out


@dataclass
class Recorder:
    """Samples /status every `every` seconds into a timeline of (t, state, phase, channels, ...)."""

    daemon: Daemon
    every: float = 0.5
    rows: list[dict[str, Any]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    def start(self) -> Recorder:
        threading.Thread(target=self._run, daemon=True).start()
        return self

    def _run(self) -> None:
        client = httpx.Client(base_url=f"http://127.0.0.1:{self.daemon.api_port}", timeout=5.0)
        while not self._stop.wait(self.every):
            try:
                s = client.get("/status").json()
            except (httpx.HTTPError, ValueError):
                continue
            serving = s.get("serving") or {}
            gpu = s.get("gpu") or {}
            self.rows.append({
                "t": round(time.time(), 3), "state": s.get("state"), "phase": s.get("phase"),
                "rung": s.get("rung"), "pid": s.get("pid"), "progress": s.get("progress"), "reason": s.get("reason"),
                "last_progress_s": s.get("last_progress_s"), "channels": s.get("channels_moved"),
                "incident": (s.get("last_incident") or {}).get("id"),
                "accept": serving.get("spec_accept_length"), "health_ok": serving.get("health_ok"),
                "gpu_held": gpu.get("tree_mem_bytes"),
                "gpu_per_device": [(d.get("index"), d.get("tree_mem_bytes")) for d in gpu.get("devices") or []],
                "roles": [(p.get("pid"), p.get("role"), p.get("rank"), p.get("status"))
                          for p in s.get("processes") or []],
                # issue 22: the GPM and py-spy rules' readings (util %, SM active ratio per GPU; the looks)
                "gpm": [(d.get("index"), d.get("util_percent"), d.get("sm_active_ratio"))
                        for d in gpu.get("devices") or []],
                "gpm_status": gpu.get("gpm_status"), "busy": s.get("busy"),
            })
        client.close()

    def stop(self) -> list[dict[str, Any]]:
        self._stop.set()
        return self.rows


class Load:
    """`clients` threads posting /generate with input_ids (no tokenizer) until stopped; another
    engine's request by `path` and `body` (vLLM: /v1/completions with a token-id prompt)."""

    def __init__(self, port: int, clients: int = 4, max_new_tokens: int = 64, *, path: str = "/generate",
                 body: dict[str, Any] | None = None) -> None:
        self.url = f"http://127.0.0.1:{port}{path}"
        self.body = body or {"input_ids": list(range(5, 69)),
                             "sampling_params": {"max_new_tokens": max_new_tokens, "ignore_eos": True}}
        self.ok = 0
        self.failed = 0
        self.last_error = ""
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(clients)]
        for t in self._threads:
            t.start()

    def _run(self) -> None:
        with httpx.Client(timeout=60.0) as c:
            while not self._stop.is_set():
                try:
                    r = c.post(self.url, json=self.body)
                    if r.status_code == 200:
                        self.ok += 1
                        continue
                    self.last_error = f"{r.status_code} {r.text[:200]}"
                except httpx.HTTPError as err:
                    self.last_error = repr(err)
                self.failed += 1
                time.sleep(0.5)

    def stop(self) -> dict[str, Any]:
        self._stop.set()
        for t in self._threads:
            t.join(70)
        return {"ok": self.ok, "failed": self.failed, "last_error": self.last_error}


def tree(pid: int) -> list[psutil.Process]:
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.Error:
        return []


def title(p: psutil.Process) -> str:
    try:
        cmd = p.cmdline()
        return " ".join(cmd) if cmd else p.name()
    except psutil.Error:
        return "?"


def _live(p: psutil.Process) -> bool:
    try:
        return p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def schedulers(pid: int) -> list[psutil.Process]:
    """The tree's scheduler processes, rank order (`sglang::scheduler`, `..._TP1`): the main process's
    live children only. A scheduler's own short-lived forks carry its title until they exec, and one
    that had just exited (a zombie) was once picked as the victim on the H200."""
    try:
        kids = psutil.Process(pid).children()
    except psutil.Error:
        return []
    procs = [p for p in kids if title(p).startswith("sglang::scheduler") and _live(p)]
    return sorted(procs, key=title)


def titles(pid: int) -> list[dict[str, Any]]:
    out = []
    for p in tree(pid):
        try:
            out.append({"pid": p.pid, "ppid": p.ppid(), "name": p.name(), "cmdline": p.cmdline(),
                        "status": p.status()})
        except psutil.Error:
            continue
    return out


def journal_after(events: list[dict[str, Any]], since_iso: str, name: str) -> list[dict[str, Any]]:
    return [e for e in events if e.get("event") == name and str(e.get("ts", "")) >= since_iso]


def iso(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int((t % 1) * 1000):03d}Z"


def ts(e: Mapping[str, Any] | None) -> float | None:
    """An event's wall time from its ISO stamp."""
    if not e or not e.get("ts"):
        return None
    from datetime import datetime

    return datetime.fromisoformat(str(e["ts"]).replace("Z", "+00:00")).timestamp()


def _cpu_s(p: psutil.Process) -> float:
    t = p.cpu_times()
    return float(t.user + t.system)


def own_cost(daemon_pid: int, seconds: float, every: float = 2.0) -> dict[str, Any]:
    """The daemon's and its log keepers' CPU (% of one core, from /proc's counters) and RSS over
    `seconds`: what the daemon costs the host while it watches."""
    daemon = psutil.Process(daemon_pid)
    keepers = [p for p in daemon.children() if "supervisor.logs.keeper" in " ".join(p.cmdline())]
    procs = {"daemon": daemon, **{f"keeper{i}": p for i, p in enumerate(keepers)}}
    c0 = {k: _cpu_s(p) for k, p in procs.items()}
    rss: dict[str, list[float]] = {k: [] for k in procs}
    t0 = time.monotonic()
    while time.monotonic() - t0 < seconds:
        for k, p in procs.items():
            rss[k].append(round(p.memory_info().rss / 1e6, 1))
        time.sleep(every)
    secs = time.monotonic() - t0
    out: dict[str, Any] = {"seconds": round(secs, 1)}
    for k, p in procs.items():
        out[k] = {"cpu_percent_of_core": round(100.0 * (_cpu_s(p) - c0[k]) / secs, 2),
                  "rss_mb_median": sorted(rss[k])[len(rss[k]) // 2], "rss_mb_max": max(rss[k]),
                  "threads": p.num_threads()}
    return out


def profile(pid: int, seconds: int, out: Path, py_spy: str = "py-spy", top: int = 15) -> dict[str, Any]:
    """`py-spy record` of a running process (raw collapsed stacks, 200 Hz, non-blocking; idle threads
    are not sampled, so the samples are the CPU it used) and its top functions by self time (the
    last frame of each stack) and by total time."""
    raw = out.with_suffix(".txt")
    cmd = [py_spy, "record", "--pid", str(pid), "--duration", str(seconds), "--rate", "200", "--nonblocking",
           "--format", "raw", "--output", str(raw)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 60, check=False)
    res: dict[str, Any] = {"rc": proc.returncode, "stderr": proc.stderr[-500:], "file": raw.name}
    if not raw.exists():
        return res
    self_n: dict[str, int] = {}
    total_n: dict[str, int] = {}
    samples = 0
    for line in raw.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        samples += n
        frames = stack.split(";")
        self_n[frames[-1]] = self_n.get(frames[-1], 0) + n
        for f in set(frames):
            total_n[f] = total_n.get(f, 0) + n
    res["samples"] = samples

    def ranked(counts: dict[str, int]) -> list[list[object]]:
        best = sorted(counts.items(), key=lambda kv: -kv[1])[:top]
        return [[f, n, round(100.0 * n / samples, 1) if samples else 0.0] for f, n in best]

    res["self"], res["total"] = ranked(self_n), ranked(total_n)
    return res

