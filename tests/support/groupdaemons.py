"""Multi-node groups on one machine: one real `sglang-supervisor run` daemon per node, each with its
own state directory, API port and simulated node."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from freeport import free_port
from simconfig import sim_settings

from supervisor.common.waiting import wait_for
from supervisor.config.render import dump_toml
from supervisor.config.settings import Settings, settings_from_mapping

TOKEN = "group-test-token-7c1e"
SECRET = "group-test-secret-0b9d4e2a6f"  # [group] secret_file: the daemons' own credential


def secret_file(tmp_path: Path, secret: str = SECRET) -> Path:
    path = tmp_path / "group-secret"
    path.write_text(secret + "\n")
    path.chmod(0o600)
    return path


@dataclass
class Node:
    rank: int
    settings: Settings
    config: Path
    log: Path
    proc: subprocess.Popen[bytes] | None = None
    token: str | None = TOKEN  # the operator's API token (None: no token, an open loopback API)
    markers: set[str] = field(default_factory=set)

    @property
    def api(self) -> str:
        return f"http://127.0.0.1:{self.settings.api.port}"

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.settings.api.port}"

    @property
    def state_dir(self) -> Path:
        return self.settings.state_dir

    def start(self) -> None:
        env = {**os.environ, "SGLANG_SUPERVISOR_TOKEN": self.token or ""}
        cmd = [sys.executable, "-m", "supervisor", "run", "--config", str(self.config), "--log-json"]
        out = self.log.open("ab")
        self.proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=out)
        out.close()

    # Timeouts are generous: a loaded CI machine runs a dozen daemons and their servers on 2 cores
    # (a `/readyz` once took over 3 s to be scheduled there); the daemon's answer is still checked.
    def get(self, path: str, *, auth: bool = True, timeout: float = 10.0) -> httpx.Response:
        headers = {"Authorization": f"Bearer {TOKEN}"} if auth else {}
        return httpx.get(self.api + path, headers=headers, timeout=timeout)

    def post(self, path: str, body: dict[str, Any] | None = None, timeout: float = 10.0) -> httpx.Response:
        return httpx.post(self.api + path, json=body, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=timeout)

    def signed(
        self, method: str, path: str, body: dict[str, Any] | None = None, timeout: float = 10.0
    ) -> httpx.Response:
        """A request as the group's leader makes it: signed with this node's key, no bearer token."""
        from supervisor.group.signing import node_key, sign_request

        raw = json.dumps(body).encode() if body is not None else b""
        s = sign_request(node_key(SECRET.encode(), self.rank), self.rank, method, path, raw, time.time())
        headers = {**s.headers(), "content-type": "application/json"}
        return httpx.request(method, self.api + path, content=raw, headers=headers, timeout=timeout)

    def status(self) -> dict[str, Any] | None:
        try:
            r = self.get("/status", timeout=5.0)
        except httpx.HTTPError:
            return None
        return r.json() if r.status_code == 200 else None  # type: ignore[no-any-return]

    def events(self, name: str | None = None) -> list[dict[str, Any]]:
        path = self.state_dir / "events.jsonl"
        if not path.exists():
            return []
        out = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        return [e for e in out if name is None or e.get("event") == name]

    def wait(self, pred: Callable[[dict[str, Any]], bool], timeout: float, what: str) -> dict[str, Any]:
        def read() -> dict[str, Any] | None:
            if self.proc is not None and self.proc.poll() is not None:
                raise AssertionError(f"node {self.rank} daemon exited {self.proc.returncode} waiting for {what}")
            return self.status()

        return wait_for(
            read, pred, timeout, what=f"{what} on node {self.rank}", interval=0.2, show=lambda st: json.dumps(st)[:2000]
        )

    def kill_daemon(self) -> None:
        assert self.proc is not None
        self.remember_marker()
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def remember_marker(self) -> None:
        with contextlib.suppress(OSError, ValueError, KeyError):
            self.markers.add(json.loads((self.state_dir / "state.json").read_text())["marker"])

    def cleanup(self) -> None:
        from supervisor.process import kill_marked

        self.remember_marker()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        for m in self.markers:
            kill_marked(m, grace_s=0.5)


def group_of(
    tmp_path: Path,
    nnodes: int = 2,
    *,
    scenarios: dict[int, str] | None = None,
    env: dict[int, dict[str, str]] | None = None,
    group: dict[str, Any] | None = None,
    args: dict[str, Any] | None = None,
    node_args: dict[int, dict[str, Any]] | None = None,
    node_group: dict[int, dict[str, Any]] | None = None,
    node_kw: dict[int, dict[str, Any]] | None = None,
    **kw: Any,
) -> list[Node]:
    """`nnodes` configs of one group: node 0 leads, every node runs the simulator as its node."""
    # One retry by default: a loopback port picked free can be taken by another process's outgoing
    # connection before the simulator binds it (EADDRINUSE at the rendezvous); the ladder retries.
    kw["restart"] = {"retries_per_rung": 1, **kw.get("restart", {})}
    api_ports = [free_port() for _ in range(nnodes)]
    rendezvous = free_port()
    secret = secret_file(tmp_path)
    nodes: list[Node] = []
    for rank in range(nnodes):
        base = tmp_path / f"node{rank}"
        base.mkdir(parents=True, exist_ok=True)
        s = sim_settings(
            base,
            (scenarios or {}).get(rank, "ok"),
            env=(env or {}).get(rank),
            **{**kw, **(node_kw or {}).get(rank, {})},
            # One model path for every node (as on shared storage): the rungs' command lines agree.
            args={
                "model-path": str(tmp_path / "model"),
                "nnodes": nnodes,
                "node-rank": rank,
                "dist-init-addr": f"127.0.0.1:{rendezvous}",
                **(args or {}),
                **((node_args or {}).get(rank, {})),
            },
        )
        data = s.model_dump()
        data["api"]["port"] = api_ports[rank]
        data["group"] = {
            "nnodes": nnodes,
            "node_rank": rank,
            "leader": f"127.0.0.1:{api_ports[0]}",
            "members": [f"127.0.0.1:{p}" for p in api_ports[1:]],
            "request_timeout_s": 1.0,
            "unreachable_s": 2.0,
            "secret_file": str(secret),
            # The tests' windows are seconds: a node away is waited for 6 s, not production's 600.
            "absent_wait_s": 6.0,
            "absent_alert_s": 4.0,
            **(group or {}),
            **(node_group or {}).get(rank, {}),
        }
        settings = settings_from_mapping(data)
        cfg = base / "config.toml"
        cfg.write_text(dump_toml(settings))
        nodes.append(Node(rank, settings, cfg, base / "daemon.log"))
    return nodes


def ready(st: dict[str, Any]) -> bool:
    return bool(st["state"] == "ready")


def group_ready(st: dict[str, Any]) -> bool:
    g = st.get("group") or {}
    return (
        st["state"] == "ready" and bool(g.get("serves")) and all(n.get("state") == "ready" for n in g.get("nodes", ()))
    )


class Load:
    """Clients generating long answers on node 0's server until stopped (or until their requests hang)."""

    def __init__(self, port: int, clients: int = 2) -> None:
        import threading

        self.port = port
        self.stop = threading.Event()
        self.answered = 0
        self.threads = [threading.Thread(target=self._client, daemon=True) for _ in range(clients)]
        for t in self.threads:
            t.start()

    def _client(self) -> None:
        body = {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 400}}
        while not self.stop.is_set():
            try:
                r = httpx.post(f"http://127.0.0.1:{self.port}/generate", json=body, timeout=20)
                self.answered += r.status_code == 200
            except httpx.HTTPError:
                time.sleep(0.2)

    def close(self) -> None:
        self.stop.set()

    def __enter__(self) -> Load:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@contextlib.contextmanager
def cut_off(node: Node) -> Iterator[list[int]]:
    """`node` cut off whole for the block: its daemon and its ranks SIGSTOPped (nothing of it answers),
    then all let go again, ranks first; the frozen ranks' pids."""
    st = node.status()
    assert st is not None and node.proc is not None
    ranks = [p["pid"] for p in st["processes"] if p["role"] == "scheduler"]
    node.proc.send_signal(signal.SIGSTOP)
    for pid in ranks:
        os.kill(pid, signal.SIGSTOP)
    try:
        yield ranks
    finally:
        for pid in ranks:
            os.kill(pid, signal.SIGCONT)
        node.proc.send_signal(signal.SIGCONT)


def twin_of(node: Node, where: Path) -> Node:
    """A second daemon claiming `node`'s node_rank: the same config but its own ports and state
    directory under `where` (issue 54: one identity per node rank). Not started."""
    d = node.settings.model_dump()
    d["api"]["port"] = free_port()
    d["server"]["port"] = free_port()
    d["paths"]["state_dir"] = str(where / "state")
    where.mkdir()
    settings = type(node.settings).model_validate(d)
    cfg = where / "config.toml"
    cfg.write_text(dump_toml(settings))
    return Node(node.rank, settings, cfg, where / "daemon.log")
