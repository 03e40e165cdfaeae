"""Record what real SGLang prints and serves, with no daemon in the way: the fixtures that keep the
simulator and the parsers honest (tests/fixtures/real_sglang/<run>/).

Files: stdout.log and stderr.log (raw bytes, carriage-return bars included), titles.jsonl (every
process of the tree, once a second), health.jsonl (every probe: status, latency, body), model_info.json,
server_info.json, metrics_idle.txt, metrics_load.txt, metrics_stalled.txt (a scheduler SIGSTOPped under
load), meta.json (versions, device, argv, and what was done when).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from bench.real import configs
from bench.real.lab import Load, free_port, schedulers, titles

READY_LINE = b"The server is fired up and ready to roll!"


def _argv(models: Path, port: int, tp: int) -> list[str]:
    args = configs.base_args(models, tp=tp)
    argv = configs.server_command()
    for k, v in args.items():
        if v is True:
            argv.append(f"--{k}")
        elif v is not False:
            argv += [f"--{k}", str(v)]
    return [*argv, "--host", "127.0.0.1", "--port", str(port)]


class _Prober:
    def __init__(self, base: str, out: Path, t0: float) -> None:
        self.base, self.out, self.t0 = base, out, t0
        self.phase = "starting"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        with open(self.out / "health.jsonl", "w") as f, httpx.Client(timeout=30.0) as c:
            while not self._stop.is_set():
                start = time.time()
                row: dict[str, Any] = {"t": round(start - self.t0, 3), "phase": self.phase}
                try:
                    r = c.get(self.base + "/health")
                    row.update(status=r.status_code, error=None, body=r.text[:500])
                except httpx.HTTPError as err:
                    row.update(status=None, error=type(err).__name__, body="")
                row["latency_s"] = round(time.time() - start, 3)
                f.write(json.dumps(row) + "\n")
                f.flush()
                self._stop.wait(max(0.0, 1.0 - (time.time() - start)))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(35)


def _titles_loop(pid: int, out: Path, t0: float, stop: threading.Event) -> None:
    with open(out / "titles.jsonl", "w") as f:
        while not stop.wait(1.0):
            t = round(time.time() - t0, 3)
            for row in titles(pid):
                f.write(json.dumps({"t": t, **row}) + "\n")
            f.flush()


def _get(base: str, path: str, timeout: float = 10.0) -> tuple[int | None, str]:
    try:
        r = httpx.get(base + path, timeout=timeout)
        return r.status_code, r.text
    except httpx.HTTPError as err:
        return None, f"{type(err).__name__}: {err}"


def record(out: Path, real: Path, models: Path, gpus: str, *, tp: int = 1) -> dict[str, Any]:
    out.mkdir(parents=True, exist_ok=True)
    port = free_port()
    argv = _argv(models, port, tp)
    env = {**os.environ, **configs.server_env(real, gpus)}
    base = f"http://127.0.0.1:{port}"
    marks: dict[str, float] = {}
    t0 = time.time()
    with open(out / "stdout.log", "wb") as so, open(out / "stderr.log", "wb") as se:
        proc = subprocess.Popen(argv, env=env, stdout=so, stderr=se, start_new_session=True)
    load: Load | None = None
    stop_titles = threading.Event()
    threading.Thread(target=_titles_loop, args=(proc.pid, out, t0, stop_titles), daemon=True).start()
    prober = _Prober(base, out, t0)
    meta: dict[str, Any] = {"argv": argv[1:], "tp": tp, "started": t0}
    try:
        end = t0 + 400
        while time.time() < end and proc.poll() is None:
            if READY_LINE in (out / "stderr.log").read_bytes() + (out / "stdout.log").read_bytes():
                break
            time.sleep(0.5)
        marks["ready_line"] = round(time.time() - t0, 3)
        prober.phase = "ready"
        time.sleep(3)
        for name, path in (("model_info.json", "/get_model_info"), ("server_info.json", "/get_server_info")):
            code, body = _get(base, path)
            (out / name).write_text(body)
            meta[f"{name}_status"] = code
        (out / "metrics_idle.txt").write_text(_get(base, "/metrics")[1])
        load = Load(port)
        time.sleep(12)
        (out / "metrics_load.txt").write_text(_get(base, "/metrics")[1])
        marks["load_started"] = round(time.time() - t0 - 12, 3)
        victim = schedulers(proc.pid)[-1]
        os.kill(victim.pid, signal.SIGSTOP)
        marks["sigstop"] = round(time.time() - t0, 3)
        prober.phase = "stalled"
        meta["stopped"] = {"pid": victim.pid, "title": " ".join(victim.cmdline())}
        time.sleep(15)
        (out / "metrics_stalled.txt").write_text(_get(base, "/metrics")[1])
        code, body = _get(base, "/get_server_info", timeout=5.0)
        meta["server_info_while_stalled"] = {"status": code, "body": body[:300]}
        time.sleep(12)  # /health takes SGLang's 20 s timeout to fail: let one complete
        meta["load"] = {"ok": load.ok, "failed": load.failed}
        os.kill(victim.pid, signal.SIGCONT)
        marks["sigcont"] = round(time.time() - t0, 3)
        time.sleep(3)
        proc.send_signal(signal.SIGTERM)  # SGLang's own shutdown path, recorded in the log
        marks["sigterm"] = round(time.time() - t0, 3)
        try:
            proc.wait(20)
            meta["sigterm_exit"] = {"code": proc.returncode, "after_s": round(time.time() - t0 - marks["sigterm"], 2)}
        except subprocess.TimeoutExpired:
            meta["sigterm_exit"] = {"code": None, "after_s": None, "note": "still running 20 s after SIGTERM"}
    finally:
        prober.stop()
        stop_titles.set()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        if load is not None:
            load.stop()
    meta["marks"] = marks
    (out / "meta.json").write_text(json.dumps(meta, indent=1))
    return meta
