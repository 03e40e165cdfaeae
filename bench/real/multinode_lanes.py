"""Issue 23 on `nvidia-h200-x2`: real SGLang 0.5.16 as two nodes of one group on one host, one daemon
per node (docs/MULTINODE.md).

Each node is `sglang.launch_server --nnodes 2 --node-rank R --tp-size 2 --dist-init-addr
127.0.0.1:PORT` with `CUDA_VISIBLE_DEVICES` one GPU per node, under its own `sglang-supervisor run`
with a `[group]` section (node 0 leads). Lane `mn2`:

1. the group starts: launch to the leader's `/status` showing every node `ready` and `group.serves`;
2. under load on node 0, node 1's scheduler SIGKILLed: the group verdict (cause, the node named),
   both nodes' bundles under one id, the group relaunched and ready, GPUs released on both nodes
   (each node's `last_stop.gpu_released`); and what SGLang did by itself: whether node 0's server
   exited before the daemons stopped it, and when (its pid watched every 0.1 s);
3. the same with node 1's scheduler SIGSTOPped.

`python3 bench/real/run.py lane mn2 --gpu 0,1 --work /tmp/real/work/mn2` writes `result.json` there
(and `bench/real/multinode_lanes.py --report FILE` prints its table). With REAL_SIMULATE=1 the same
lane runs against the built-in simulator on a CPU machine (`--real DIR` with `bin/py-spy`).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import psutil

from bench.common import free_port
from bench.real.configs import FAST, config, daemon_env
from bench.real.lab import ROOT, Load, schedulers
from supervisor.common.waiting import wait_for
from supervisor.config.render import dump_toml
from supervisor.config.settings import settings_from_mapping


class Node:
    """One node's daemon, `python3 -m supervisor run`, in its own session."""

    def __init__(self, rank: int, work: Path, cfg: dict[str, Any], env: dict[str, str]) -> None:
        self.rank = rank
        self.work = work
        work.mkdir(parents=True, exist_ok=True)
        self.api = f"http://127.0.0.1:{cfg['api']['port']}"
        path = work / "config.toml"
        path.write_text(dump_toml(settings_from_mapping(cfg)))
        self.log = open(work / "daemon.log", "wb")  # noqa: SIM115 - lives as long as the daemon
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "supervisor", "run", "--config", str(path)],
            env=env, cwd=ROOT, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        self.http = httpx.Client(base_url=self.api, timeout=10.0)

    def status(self) -> dict[str, Any]:
        try:
            r = self.http.get("/status")
            return dict(r.json()) if r.status_code == 200 else {}
        except (httpx.HTTPError, ValueError):
            return {}

    def wait(self, pred: Any, timeout: float) -> dict[str, Any]:
        def read() -> dict[str, Any] | None:
            if self.proc.poll() is not None:
                raise RuntimeError(f"node {self.rank} daemon exited {self.proc.returncode}")
            return self.status() or None

        return wait_for(
            read, pred, timeout, what=f"match on node {self.rank}", interval=0.25,
            show=lambda st: f"{st.get('state')} {st.get('reason')}",
        )  # fmt: skip

    def events(self) -> list[dict[str, Any]]:
        try:
            return list(self.http.get("/events", params={"limit": 1000}).json()["events"])
        except (httpx.HTTPError, ValueError, KeyError):
            return []

    def bundle(self, bundle_id: str) -> dict[str, Any]:
        try:
            r = self.http.get(f"/diagnostics/{bundle_id}")
            return dict(r.json()) if r.status_code == 200 else {}
        except (httpx.HTTPError, ValueError):
            return {}

    def close(self) -> int | None:
        try:
            self.http.post("/stop", json={}, timeout=120.0)
            self.wait(lambda s: s.get("state") in ("stopped", "failed"), 120.0)
        except Exception:  # the daemon's own SIGTERM path stops the tree too
            pass
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.http.close()
        self.log.close()
        return self.proc.returncode


def group_ready(st: dict[str, Any]) -> bool:
    g = st.get("group") or {}
    nodes = g.get("nodes") or ()
    return st.get("state") == "ready" and bool(g.get("serves")) and all(n.get("state") == "ready" for n in nodes)


class PidWatch:
    """When (if ever) a pid stopped existing: SGLang's own exit, told apart from the daemons' stop."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.gone_at: float | None = None
        self._stop = threading.Event()
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                if psutil.Process(self.pid).status() == psutil.STATUS_ZOMBIE:
                    raise psutil.NoSuchProcess(self.pid)
            except psutil.Error:
                self.gone_at = time.time()
                return
            time.sleep(0.1)

    def stop(self) -> None:
        self._stop.set()


def _ts(e: dict[str, Any]) -> float:
    import datetime as dt

    return dt.datetime.fromisoformat(str(e["ts"]).replace("Z", "+00:00")).timestamp()


def _first(events: list[dict[str, Any]], name: str, after: float, **match: Any) -> float | None:
    for e in events:
        if e.get("event") == name and _ts(e) >= after and all(e.get(k) == v for k, v in match.items()):
            return _ts(e)
    return None


def fault(kind: str, nodes: list[Node], port: int) -> dict[str, Any]:
    leader, worker = nodes
    before = [n.status() for n in nodes]
    victim = schedulers(int(before[1]["pid"]))[0]
    watch = PidWatch(int(before[0]["pid"]))  # node 0's server: does SGLang end it by itself?
    load = Load(port, clients=4, max_new_tokens=256)
    time.sleep(3.0)
    onset = time.time()
    os.kill(victim.pid, signal.SIGKILL if kind == "sigkill" else signal.SIGSTOP)
    out: dict[str, Any] = {"fault": kind, "victim": {"pid": victim.pid, "title": victim.name()}}
    try:
        st = leader.wait(lambda s: s.get("incidents", 0) > before[0].get("incidents", 0), 300)
        inc = st["last_incident"]
        out["incident"] = inc
        ready = leader.wait(lambda s: s.get("restarts", 0) > before[0].get("restarts", 0) and group_ready(s), 600)
        out["group_ready_s"] = round(time.time() - onset, 2)
        ev = leader.events()
        hung = _first(ev, "state_changed", onset, new="hung")
        evidence = _first(ev, "group_evidence", onset)
        stop = _first(ev, "group_stop", onset)
        out["verdict_s"] = round(hung - onset, 2) if hung else None
        out["evidence_s"] = round(evidence - onset, 2) if evidence else None
        out["bundles"] = {n.rank: bool(n.bundle(inc["id"])) for n in nodes}
        out["gpu_released"] = {n.rank: (n.status().get("last_stop") or {}).get("gpu_released") for n in nodes}
        out["node0_exited_by_itself"] = watch.gone_at is not None and (stop is None or watch.gone_at < stop - 1.0)
        out["node0_gone_s"] = round(watch.gone_at - onset, 2) if watch.gone_at else None
        out["ready"] = {"leader_pid": ready.get("pid"), "worker_pid": worker.status().get("pid")}
    finally:
        watch.stop()
        out["load"] = load.stop()
        if kind == "sigstop":
            with contextlib.suppress(OSError):
                os.kill(victim.pid, signal.SIGCONT)
    return out


def lane_mn2(work: Path, real: Path, models: Path, gpu: str) -> dict[str, Any]:
    gpus = gpu.split(",")[:2] if "," in gpu else [gpu, gpu]
    api = [free_port(), free_port()]
    store = free_port()
    env = daemon_env(real)
    nodes: list[Node] = []
    ports: list[int] = []
    secret = work / "group-secret"  # the daemons sign to each other ([group] secret_file)
    secret.parent.mkdir(parents=True, exist_ok=True)
    secret.write_text(os.urandom(24).hex() + "\n")
    secret.chmod(0o600)
    res: dict[str, Any] = {"lane": "mn2", "simulated": os.environ.get("REAL_SIMULATE") == "1", "gpus": gpus}
    t0 = time.time()
    try:
        for rank in (0, 1):
            cfg = config(
                real, models, gpus=gpus[rank], watchdog={**FAST, "startup_stall_s": 120.0}, tp=2, fallbacks=False
            )
            cfg["server"]["port"] = free_port()
            cfg["server"]["args"].update({"nnodes": 2, "node-rank": rank, "dist-init-addr": f"127.0.0.1:{store}"})
            cfg["api"] = {"port": api[rank]}
            cfg["paths"] = {"state_dir": str(work / f"node{rank}" / "state")}
            cfg["restart"]["retries_per_rung"] = 3
            cfg["group"] = {
                "nnodes": 2,
                "node_rank": rank,
                "leader": f"127.0.0.1:{api[0]}",
                "members": [f"127.0.0.1:{api[1]}"],
                "request_timeout_s": 3.0,
                "unreachable_s": 10.0,
                "secret_file": str(secret),
            }
            nodes.append(Node(rank, work / f"node{rank}", cfg, env))
            ports.append(int(cfg["server"]["port"]))
        st = nodes[0].wait(group_ready, 900)
        res["group_ready_s"] = round(time.time() - t0, 2)
        res["start"] = {"rung": st.get("rung"), "nodes": (st.get("group") or {}).get("nodes")}
        port0 = ports[0]
        res["faults"] = [fault("sigkill", nodes, port0), fault("sigstop", nodes, port0)]
    except Exception as err:
        res["error"] = repr(err)
    finally:
        res["events"] = {n.rank: n.events() for n in nodes}
        res["daemon_exit"] = [n.close() for n in reversed(nodes)]
    return res


LANES = {"mn2": lane_mn2}


def report(res: dict[str, Any]) -> str:
    lines = [
        f"group ready from launch: {res.get('group_ready_s')} s" + (" (REAL_SIMULATE)" if res.get("simulated") else ""),
        "| fault on node 1 | verdict | named | onset to verdict | to evidence | bundles (node 0/1) "
        "| group ready again | GPUs released (0/1) | node 0 exited by itself |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for f in res.get("faults", ()):
        inc = f.get("incident") or {}
        b, g = f.get("bundles") or {}, f.get("gpu_released") or {}
        bundles = f"{b.get(0, b.get('0'))}/{b.get(1, b.get('1'))}"
        released = f"{g.get(0, g.get('0'))}/{g.get(1, g.get('1'))}"
        exited = f"{f.get('node0_exited_by_itself')} ({f.get('node0_gone_s')} s)"
        detail = str(inc.get("detail", ""))
        named = detail[max(0, detail.find("node ")) :][:80]
        lines.append(
            f"| scheduler {f['fault']} | {inc.get('cause')} | {named} "
            f"| {f.get('verdict_s')} s | {f.get('evidence_s')} s | {bundles} | {f.get('group_ready_s')} s "
            f"| {released} | {exited} |"
        )
    if res.get("error"):
        lines.append(f"error: {res['error']}")
    return "\n".join(lines)


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description="issue 23's lane result as a table")
    ap.add_argument("--report", type=Path, required=True, help="a result.json of lane mn2")
    print(report(json.loads(ap.parse_args().report.read_text())))
