"""The simulator held against every real SGLang transcript: given the real run's command line, it
must print the same kinds of lines with the same fields, draw the same bars, expose the same metric
names with the same labels, name its processes the same way (late, as real children do), answer
/health the same way by phase, and never invent a /get_server_info field SGLang does not have.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from freeport import free_port
from prometheus_client.parser import text_string_to_metric_families
from transcripts import RUNS, Transcript

from probes.logs import clean, parse_progress, split_prefix
from probes.proctree import MARKER_ENV, ProcessTreeProbe
from supervisor.process import kill_marked

pytestmark = [pytest.mark.integration, pytest.mark.skipif(not RUNS, reason="no transcript")]
ROOT = Path(__file__).resolve().parents[2]
READY = "The server is fired up and ready to roll!"
# Line kinds the simulator models; a real transcript's other lines (warnings of its environment,
# e.g. `Ignore import error ...`) are not held against it.
MODELLED = (
    "Max running requests is reset to 48 for speculative decoding",
    "Init torch distributed begin",
    "Init torch distributed ends",
    "Load weight begin",
    "Load weight end",
    "KV Cache is allocated",
    "Memory pool end",
    "Capture target decode CUDA graph begin",
    "Capture target decode CUDA graph end",
    "Capture target verify CUDA graph begin",
    "Capture target verify CUDA graph end",
    "Capture target prefill CUDA graph begin",
    "Capture target prefill CUDA graph end",
    "Capture draft decode CUDA graph begin",
    "Capture draft decode CUDA graph end",
    "Capture draft extend CUDA graph begin",
    "Capture draft extend CUDA graph end",
    "max_total_num_tokens",
    "Prefill batch",
    "Decode batch",
    READY,
    "Endpoint '/get_server_info' is deprecated and will be removed in a future version",
    "Health check failed",
    "kill_process_tree called",
    "Subprocess scheduler_",
    "SIGQUIT received",
    "Sleeping 5 seconds before crash diagnostics",
    "No live scheduler processes found",
)
_KEY = re.compile(r"(?:^|, |\. )([#A-Za-z][\w #()/-]*?)(?:=|: )")


def shape(message: str) -> tuple[str, tuple[str, ...]]:
    """(kind, field names): `Load weight end. elapsed=0.2 s, type=X` -> ("Load weight end", ("elapsed", "type"))."""
    keys = list(_KEY.finditer(message))
    names = tuple(m.group(1).strip() for m in keys)
    if not keys:
        return message.strip().rstrip("."), ()
    head = message[: keys[0].start()].strip(" ,.")
    return (head or names[0]), names if head else names[1:]


def shapes(messages: list[str]) -> dict[str, set[tuple[str, ...]]]:
    out: dict[str, set[tuple[str, ...]]] = {}
    for text in messages:
        if not text.startswith("["):
            continue
        kind, names = shape(split_prefix(text)[1])
        for modelled in MODELLED:
            if kind.startswith(modelled):
                out.setdefault(modelled, set()).add(names)
    return out


@dataclass
class SimRun:
    stderr: str = ""
    roles_seen: set[str] = field(default_factory=set)
    untitled: set[str] = field(default_factory=set)  # how children looked before naming themselves
    final_titles: list[str] = field(default_factory=list)
    metrics: str = ""
    server_info: dict[str, object] = field(default_factory=dict)
    model_info: dict[str, object] = field(default_factory=dict)
    health_ready: tuple[int, float] = (0, 0.0)
    health_stopped: int | None = None


def _untitled_kind(title: str) -> str:
    """A child before setproctitle: multiprocessing's spawn bootstrap, or its parent's argv."""
    return "spawn bootstrap" if "spawn_main" in title else "parent's command line"


def _get(url: str, timeout: float = 30.0) -> tuple[int, bytes, float]:
    tic = time.monotonic()
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url, timeout=timeout) as resp:
            return resp.status, resp.read(), time.monotonic() - tic
    except urllib.error.HTTPError as e:
        return e.code, b"", time.monotonic() - tic


def _generate(base: str, tokens: int) -> None:
    body = json.dumps({"input_ids": [1, 2, 3, 4, 5, 6], "sampling_params": {"max_new_tokens": tokens}}).encode()
    req = urllib.request.Request(base + "/generate", data=body, headers={"Content-Type": "application/json"})
    urllib.request.build_opener(urllib.request.ProxyHandler({})).open(req, timeout=60).read()


def _argv(run: Transcript, port: int) -> list[str]:
    """The real run's own flags, on a free port: the simulator is given what SGLang was given."""
    argv = run.argv
    flags = argv[argv.index("sglang.launch_server") + 1 :] if "sglang.launch_server" in argv else argv
    out: list[str] = []
    skip = False
    for a in flags:
        if skip or a.startswith(("--port=", "--host=")):
            skip = False
            continue
        if a in ("--port", "--host"):
            skip = True
            continue
        out.append(a)
    return [sys.executable, "-m", "supervisor.simulator", *out, "--host", "127.0.0.1", "--port", str(port)]


def _simulate(run: Transcript, tmp: Path) -> SimRun:
    port, marker = free_port(), f"fidelity-{uuid.uuid4().hex[:10]}"
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        MARKER_ENV: marker,
        "SGLANG_SIM_PACE": "0.1",
        "SGLANG_SIM_IMPORT_S": "1.5",  # long enough to see the children before they name themselves
        "SGLANG_SIM_DECODE_STEP_S": "0.005",
        "SGLANG_HEALTH_CHECK_TIMEOUT": "1",
        "SGLANG_SIM_HEALTH_LATENCY_S": "0.3",
    }
    err_path, out_path = tmp / "stderr.log", tmp / "stdout.log"
    with open(err_path, "wb") as err, open(out_path, "wb") as out:
        proc = subprocess.Popen(_argv(run, port), cwd=ROOT, env=env, stdout=out, stderr=err, start_new_session=True)
    got = SimRun()
    base = f"http://127.0.0.1:{port}"
    probe = ProcessTreeProbe(with_threads=False)
    try:
        deadline = time.monotonic() + 60
        while READY not in err_path.read_text(errors="replace"):
            assert proc.poll() is None and time.monotonic() < deadline, err_path.read_text(errors="replace")[-3000:]
            seen = probe.observe(proc.pid, marker).processes
            got.roles_seen |= {p.role for p in seen}
            got.untitled |= {_untitled_kind(p.title) for p in seen if p.role == "pending"}
            time.sleep(0.05)
        got.final_titles = sorted(p.title for p in probe.observe(proc.pid, marker).processes if p.pid != proc.pid)
        status, _, latency = _get(base + "/health")
        got.health_ready = (status, latency)
        got.server_info = json.loads(_get(base + "/get_server_info")[1])
        got.model_info = json.loads(_get(base + "/get_model_info")[1])
        load = [threading.Thread(target=_generate, args=(base, 200)) for _ in range(3)]
        for t in load:
            t.start()
        for t in load:
            t.join(60)
        # after the load: the tokenizer's counters exist once requests finished (spec_verify_calls_total)
        got.metrics = _get(base + "/metrics")[1].decode()
        scheduler = next(p.pid for p in probe.observe(proc.pid, marker).processes if p.role == "scheduler")
        os.kill(scheduler, signal.SIGSTOP)
        got.health_stopped = _get(base + "/health", timeout=10)[0]
        os.kill(scheduler, signal.SIGCONT)
        if run.tp_size == 1:  # SGLang's crash path: a dead scheduler, the subprocess-watchdog, the SIGQUIT
            os.kill(scheduler, signal.SIGKILL)
            proc.wait(30)
    finally:
        kill_marked(marker, grace_s=0.2)
        proc.wait(10)
    got.stderr = err_path.read_text(errors="replace")
    return got


@pytest.fixture(scope="module", params=RUNS)
def pair(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Transcript, SimRun]]:
    run = Transcript(request.param)
    yield run, _simulate(run, tmp_path_factory.mktemp(f"sim-{request.param}"))


def _sim_messages(sim: SimRun) -> list[str]:
    return [seg for line in sim.stderr.split("\n") for seg in line.split("\r") if seg.strip()]


def test_the_same_kinds_of_lines_with_the_same_fields(pair: tuple[Transcript, SimRun]) -> None:
    run, sim = pair
    real = shapes(run.messages("stderr"))
    mine = shapes(_sim_messages(sim))
    missing = sorted(set(real) - set(mine))
    assert not missing, f"the simulator never prints: {missing}"
    for kind, fields in real.items():
        assert mine[kind] == fields, (kind, sorted(mine[kind]), sorted(fields))


def test_the_same_crash_path(pair: tuple[Transcript, SimRun]) -> None:
    """A scheduler SIGKILLed while serving: the same lines, with the same fields, in the same order."""
    run, sim = pair
    real_lines = run.messages("crash_path")
    if not real_lines or run.tp_size != 1:
        pytest.skip("no crash path recorded at tp-size 1")
    crash = (
        "Subprocess scheduler_", "SIGQUIT received", "Sleeping 5 seconds", "No live scheduler", "kill_process_tree",
    )

    def sequence(messages: list[str]) -> list[tuple[str, tuple[str, ...]]]:
        out = []
        for m in messages:
            if m.startswith("["):
                kind, names = shape(split_prefix(m)[1])
                if kind.startswith(crash):
                    out.append((next(c for c in crash if kind.startswith(c)), names))
        return out

    assert sequence(_sim_messages(sim)) == sequence(real_lines)


def test_the_same_rank_tags(pair: tuple[Transcript, SimRun]) -> None:
    run, sim = pair
    real = {split_prefix(m)[0] for m in run.messages() if m.startswith("[")}
    mine = {split_prefix(m)[0] for m in _sim_messages(sim) if m.startswith("[")}
    assert mine == real


def test_the_same_progress_bars(pair: tuple[Transcript, SimRun]) -> None:
    run, sim = pair

    def labels(messages: list[str]) -> set[str]:
        return {p.label for m in messages if (p := parse_progress(split_prefix(m)[1])) is not None}

    assert labels(run.messages()) <= labels(_sim_messages(sim))


def test_the_same_metric_names_and_labels(pair: tuple[Transcript, SimRun]) -> None:
    run, sim = pair
    real_text = run.metrics("load") or run.metrics("idle")
    assert real_text is not None

    def families(text: str) -> dict[str, set[str]]:
        return {
            f.name: {k for s in f.samples for k in s.labels if k not in ("le", "mode")}
            for f in text_string_to_metric_families(text)
        }

    real, mine = families(real_text), families(sim.metrics)
    read_by_the_probe = {
        "sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:gen_throughput", "sglang:generation_tokens",
        "sglang:realtime_tokens", "sglang:num_requests", "sglang:spec_accept_length", "sglang:http_requests_active",
    }
    spec = {n for n in real if n.startswith("sglang:spec_")}
    for name in (read_by_the_probe | spec) & set(real):
        assert name in mine, name
    for name in set(real) & set(mine):
        assert mine[name] == real[name], (name, mine[name], real[name])


def test_the_same_titles_set_late(pair: tuple[Transcript, SimRun]) -> None:
    run, sim = pair
    rows = run.titles()
    stop = run.mark("sigterm")
    last = max(r.t for r in rows if stop is None or r.t < stop)
    root = run.root_pid()
    real = sorted(r.title for r in run.state_at(last) if r.ppid == root and "resource_tracker" not in r.title)
    mine = sorted(t for t in sim.final_titles if "resource_tracker" not in t)
    assert mine == real
    assert "pending" in sim.roles_seen  # children seen before they named themselves, as on the real host
    root_title = next(r.title for r in rows if r.pid == root)
    real_untitled = {
        _untitled_kind(r.title)
        for r in rows
        if r.ppid == root and not r.title.startswith("sglang::") and "resource_tracker" not in r.title
        and ("spawn_main" in r.title or r.title == root_title)
    }
    assert real_untitled <= sim.untitled, (real_untitled, sim.untitled)


def test_health_answers_the_same_way_by_phase(pair: tuple[Transcript, SimRun]) -> None:
    run, sim = pair
    assert run.health_in("ready") and sim.health_ready[0] == 200
    assert sim.health_ready[1] >= 0.2  # a one-token generate, not a bare 200 (real: ~1 s)
    stalled = run.health_in("stalled")
    if stalled:
        assert sim.health_stopped == 503 and all(r.status in (503, None) for r in stalled)


def test_server_info_invents_no_field(pair: tuple[Transcript, SimRun]) -> None:
    run, sim = pair
    real = run.json("server_info.json")
    assert isinstance(real, dict)
    invented = sorted(set(sim.server_info) - set(real))
    assert not invented, invented
    real_state, state = real["internal_states"][0], sim.server_info["internal_states"][0]  # type: ignore[index]
    for key in ("last_gen_throughput", "memory_usage", "avg_spec_accept_length"):
        assert (key in real_state) == (key in state), key
    model = run.json("model_info.json")
    assert isinstance(model, dict) and set(sim.model_info) == set(model)


def test_the_same_warnings_before_logging_starts(pair: tuple[Transcript, SimRun]) -> None:
    """Deprecated flags of the real command line: the same bare yellow warnings, word for word."""
    run, sim = pair

    def bare(messages: list[str]) -> set[str]:
        warned = ("is deprecated and will be removed", "is the recommended entrypoint")
        return {
            clean(m).split(": UserWarning: ")[-1]  # the file path differs: where SGLang is installed
            for m in messages
            if not m.startswith("[") and any(w in m for w in warned)
        }

    assert bare(_sim_messages(sim)) == bare(run.messages())
