"""`sglang-supervisor demo`: the daemon on its embedded default, the built-in SGLang simulator.

Rung `base` deadlocks right after the weights load (as in the seed incident: weights in memory, no
port, no log line); the daemon sees no progress for the stall window, captures py-spy stacks of
every process, stops and verifies the tree, and falls back to rung `no-cuda-graph`, which serves.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import socket
import sys
import tempfile
from pathlib import Path

from supervisor.config.render import dump_mapping
from supervisor.config.settings import load_settings
from supervisor.logs import setup as logsetup
from supervisor.simulator.daemonconfig import SimWindows, sim_config, vllm_rung
from supervisor.simulator.gpu.kernel import create as create_gpu_file
from supervisor.status.snapshot import StatusSnapshot


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


# Slow enough for a person to watch: a one-second poll, an eight-second stall window.
DEMO_WINDOWS = SimWindows(
    poll_s=1.0,
    startup_stall_s=8.0,
    startup_timeout_s=300.0,
    cpu_only_stall_s=30.0,
    health_interval_s=2.0,
    health_timeout_s=5.0,
    backoff_initial_s=1.0,
    backoff_max_s=5.0,
    stop_grace_s=5.0,
    release_timeout_s=5.0,
    pace=0.5,
    health_latency_s=0.2,
)
HEADER = """\
# Written by `sglang-supervisor demo`: the built-in SGLang simulator stands in for a GPU server.
# The simulator's behaviour: deadlock right after the weights load, unless --disable-cuda-graph.
# No GPU here: the daemon reads the simulator's GPU, a JSON file the simulated server writes to.
"""


CROSS_HEADER = """\
# Written by `sglang-supervisor demo --cross-engine`: the built-in simulator speaks SGLang, then vLLM.
# The simulator's behaviour: deadlock right after the weights load, unless --enforce-eager (a vLLM
# flag): both SGLang rungs hang, and the ladder ends on vLLM without speculation, which serves.
"""
MODEL = "/models/demo-model"


def demo_config(state_dir: Path, server_port: int, api_port: int, *, cross_engine: bool = False) -> str:
    no_graph = {"name": "no-cuda-graph", "args": {"disable-cuda-graph": True}, "on": ["cuda_graph_capture"]}
    data = sim_config(
        DEMO_WINDOWS,
        scenario="deadlock_after_load",
        state_dir=state_dir,
        model_path=MODEL,
        server_port=server_port,
        api_port=api_port,
        env={"SGLANG_SIM_UNLESS": "enforce-eager" if cross_engine else "disable-cuda-graph"},
        args={"speculative-algorithm": "EAGLE3", "speculative-draft-model-path": "/models/demo-eagle3"}
        if cross_engine
        else None,
        fallback=[
            {k: v for k, v in no_graph.items() if k != "on"},
            vllm_rung("vllm-no-spec", MODEL, 2, **{"enforce-eager": True}),
        ]
        if cross_engine
        else [no_graph],
        api={"host": "127.0.0.1"},
        gpu_file=state_dir / "simulated-gpu.json",
    )
    data["server"] = {"host": "127.0.0.1", **data["server"]}
    return (CROSS_HEADER if cross_engine else HEADER) + dump_mapping(data)


def story_told(s: StatusSnapshot) -> bool:
    """The demo's story is told: an incident was caught, its evidence written, and the server
    serves on a fallback rung. `--until-recovered` (what `make demo` runs) ends the demo there."""
    li = s.last_incident
    return s.state == "ready" and (s.rung_index or 0) >= 1 and li is not None and li.bundle is not None


def status_line(s: StatusSnapshot, t: float) -> str:
    parts = [f"[{t:5.1f}s] state={s.state:<10}", f"rung={s.rung}"]
    if len(set(s.ladder_engines)) > 1 and s.engine:  # a ladder that crosses engines
        parts.append(f"engine={s.engine}")
    if s.phase:
        parts.append(f"phase={s.phase}")
    if s.progress is not None:
        parts.append(f"progress={s.progress.done}/{s.progress.total}")
    if s.last_progress_s is not None and s.state in ("starting", "hung"):
        parts.append(f"quiet={s.last_progress_s:.0f}s")
    if s.last_incident is not None:
        li = s.last_incident
        parts.append(f"incident={li.cause}/{li.hang_class or '-'}")
    if s.state == "ready" and s.time_to_ready_s is not None:
        parts.append(f"ready_in={s.time_to_ready_s:.1f}s")
    return " ".join(parts)


async def _demo(config_path: Path, duration: float | None, until_recovered: bool) -> tuple[int, StatusSnapshot | None]:
    from supervisor.root.inprocess import start_in_process

    settings = load_settings(config_path)
    loop = asyncio.get_running_loop()
    start = loop.time()
    daemon = await start_in_process(settings, config_path=config_path, signals=True, start_timeout=60.0)
    task = daemon.task
    # Ctrl-C goes to the supervisor's queue (the runner installed the handler): shut down cleanly.
    last = ""
    tty = sys.stdout.isatty()
    told_at: float | None = None
    while not task.done():
        t = loop.time() - start
        snap = daemon.snapshot()
        line = status_line(snap, t)
        if line != last or tty:
            print(("\r" + line.ljust(120)) if tty else line, end="" if tty else "\n", flush=True)
            last = line
        if until_recovered and told_at is None and story_told(snap):
            told_at = t
        # A few seconds of serving on the fallback rung, then the end of the story.
        if (duration is not None and t >= duration) or (told_at is not None and t >= told_at + 3.0):
            os.kill(os.getpid(), signal.SIGTERM)
            break
        await asyncio.sleep(1.0)
    rc = await task
    if tty:
        print()
    return rc, daemon.snapshot()


def run_demo(
    *,
    duration: float | None,
    state_dir: str | None,
    keep: bool,
    until_recovered: bool = False,
    cross_engine: bool = False,
) -> int:
    temp = state_dir is None
    root = Path(state_dir) if state_dir else Path(tempfile.mkdtemp(prefix="sglang-supervisor-demo-"))
    root.mkdir(parents=True, exist_ok=True)
    api_port = free_port()
    config_path = root / "demo.toml"
    config_path.write_text(demo_config(root, free_port(), api_port, cross_engine=cross_engine))
    gpu = load_settings(config_path).gpu
    if gpu.file:
        create_gpu_file(Path(gpu.file), gpus=2)  # tp-size 2
    logsetup.configure(json=False, level="WARNING")
    print(f"sglang-supervisor demo: config {config_path}, API http://127.0.0.1:{api_port}/status")
    if cross_engine:
        print("SGLang rungs 'base' and 'no-cuda-graph' deadlock after the weights load; watch the ladder end on vLLM.")
    else:
        print("rung 'base' deadlocks after the weights load; watch it be detected, diagnosed and fall back.")
    if until_recovered:
        print("It ends by itself once the server serves on the fallback rung; Ctrl-C to stop sooner.")
    else:
        print("Ctrl-C to stop.")
    where = "deleted at the end (--keep keeps it)" if temp and not keep else "kept"
    print(f"logs, evidence bundles and the event journal go to {root} ({where})")
    print(f"GPU: {gpu.describe()}")
    rc, snap = asyncio.run(_demo(config_path, duration, until_recovered))
    if snap is not None:
        print(f"final: state={snap.state} rung={snap.rung} restarts={snap.restarts} incidents={snap.incidents}")
        if snap.last_incident is not None:
            li = snap.last_incident
            print(f"last incident: {li.id} cause={li.cause} class={li.hang_class} bundle={li.bundle}")
            if li.bundle:
                summary = root / "diagnostics" / li.bundle / "summary.txt"
                if summary.exists():
                    print(f"evidence: {summary}")
                    print("".join(summary.read_text().splitlines(keepends=True)[:25]))
    if temp and not keep:
        with contextlib.suppress(OSError):
            shutil.rmtree(root)
        print(f"deleted {root} (run with --keep to keep the evidence)")
    else:
        print(f"state kept in {root}: bundles in {root / 'diagnostics'}, journal {root / 'events.jsonl'}")
    return rc
