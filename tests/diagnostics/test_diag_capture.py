"""Captures against real process trees from deadlock_prog.py: py-spy, gdb and /proc for real."""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import stat
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import psutil
import pytest

from probes.types import GpuDevice, GpuObservation, GpuProcess
from supervisor.diagnostics import CaptureRequest, capture

if TYPE_CHECKING:  # fixtures from conftest.py (import mode importlib: not importable at run time)
    from conftest import InfoFn, Launcher, ResumeLog

WaitFn = Callable[..., bool]

pytestmark = pytest.mark.integration
needs_gdb = pytest.mark.skipif(shutil.which("gdb") is None, reason="gdb not installed")
PY_SPY = str(Path(sys.executable).parent / "py-spy")
KEEP = {"keep": 10, "max_bytes": 10**9}


def request(processes: tuple[object, ...], **kw: object) -> CaptureRequest:
    base: dict[str, object] = {
        "incident_id": "20261129T144501Z-startup_stall",
        "trigger": "hung",
        "cause": "startup_stall",
        "processes": processes,
        "py_spy_timeout_s": 10.0,
        "gdb_timeout_s": 20.0,
        "rung": "base",
        "argv": ("python3", "-m", "sglang.launch_server", "--tp-size", "2"),
        "tree_cpu_cores": 0.0,
        "gpu_util_percent": 0.0,
    }
    base.update(kw)
    return CaptureRequest(**base)  # type: ignore[arg-type]


def tool(result: object, pid: int, name: str) -> str:
    outcomes = {(t.pid, t.tool): t.outcome for t in result.tools}  # type: ignore[attr-defined]
    return outcomes.get((pid, name), "absent")


@needs_gdb
async def test_deadlocked_tree_bundle_names_every_deadlocked_thread(
    launch: Launcher, resume: ResumeLog, tmp_path: Path
) -> None:
    tree = launch("deadlock", 2)
    req = request(tree.infos(), native=True, gdb=True, phase="allocating_kv")
    result = await capture(req, tmp_path, py_spy_path=PY_SPY, resume=resume, **KEEP)

    assert result.error is None and result.path == tmp_path / req.incident_id
    assert result.hang_class == "idle_deadlock"
    text = (result.path / "summary.txt").read_text()
    for rank, pid in enumerate(tree.children):
        who = f"scheduler TP{rank} pid {pid}: thread"
        assert f"{who} 'weights-sync' waits in acquire at deadlock_prog.py:25 (take_a_then_b)" in text
        assert f"{who} 'graph-pool' waits in acquire at deadlock_prog.py:31 (take_b_then_a)" in text
        assert f"{who} 'heartbeat' sleeps" in text
    assert "Hang class: idle_deadlock" in text

    for pid in tree.pids:
        for name in ("py-spy", "py-spy-native"):
            assert tool(result, pid, name) == "ok", (pid, name, result.tools)
        # Every thread of these processes is a Python thread, and py-spy --native named its native
        # frames: gdb would repeat them, and is skipped with the reason (issue 36, the daemon's share).
        assert tool(result, pid, "gdb") == "skipped", (pid, result.tools)
        (why,) = [t.detail for t in result.tools if t.pid == pid and t.tool == "gdb"]
        assert "named the native frames of all" in why
        for f in (f"pyspy-{pid}.txt", f"pyspy-native-{pid}.txt", f"proc-{pid}.txt"):
            assert (result.path / f).stat().st_size > 0
        assert not (result.path / f"gdb-{pid}.txt").exists()
        assert psutil.Process(pid).status() != psutil.STATUS_STOPPED
    for f in ("summary.json", "log-tail.txt", "env.json", "nvml.json", "verdict.json"):
        assert (result.path / f).is_file()
    # Every tool run is followed by a resume of its process.
    assert sorted(resume.calls) == sorted([(pid,) for pid in tree.pids for _ in range(2)])

    # In parallel: the capture took less than the tools' durations added up.
    tool_sum = sum(t.duration_s for t in result.tools)
    durations = result.summary["durations"]
    assert isinstance(durations, dict)
    assert durations["tools_s"] < tool_sum
    assert result.duration_s < 15

    doc = json.loads((result.path / "summary.json").read_text())
    for key in ("id", "created_at", "trigger", "cause", "hang_class", "reasons", "frames", "rung", "phase",
                "argv", "pids", "tools", "durations", "nvml", "errors"):  # fmt: skip
        assert key in doc
    assert {p["pid"]: p["role"] for p in doc["pids"]} == {
        tree.parent.pid: "main",
        tree.children[0]: "scheduler",
        tree.children[1]: "scheduler",
    }
    assert doc["phase"] == "allocating_kv" and doc["created_at"].endswith("Z")


@needs_gdb
async def test_gdb_runs_where_a_thread_has_no_python_state(launch: Launcher, resume: ResumeLog, tmp_path: Path) -> None:
    """A rank with a C thread py-spy cannot list (faulthandler's, as NCCL's and CUDA's in a real rank):
    its only native stack is gdb's, so gdb runs there; the parent, all Python, is covered by py-spy."""
    tree = launch("deadlock", 1, env={**os.environ, "DEADLOCK_PROG_NATIVE_THREAD": "1"})
    req = request(tree.infos(), native=True, gdb=True)
    result = await capture(req, tmp_path, py_spy_path=PY_SPY, resume=resume, **KEEP)
    assert result.path is not None and result.hang_class == "idle_deadlock"
    (child,) = tree.children
    assert tool(result, child, "gdb") == "ok", result.tools
    assert psutil.Process(child).num_threads() > len(
        [x for x in (result.path / f"pyspy-native-{child}.txt").read_text().splitlines() if x.startswith("Thread ")]
    )
    assert "faulthandler" in (result.path / f"gdb-{child}.txt").read_text()
    assert tool(result, tree.parent.pid, "gdb") == "skipped"


@needs_gdb
async def test_busy_spin_tree(launch: Launcher, resume: ResumeLog, tmp_path: Path) -> None:
    tree = launch("busy", 1)
    req = request(tree.infos(), native=True, gdb=True, tree_cpu_cores=None, gpu_util_percent=None)
    result = await capture(req, tmp_path, py_spy_path=PY_SPY, resume=resume, **KEEP)
    assert result.hang_class == "busy_spin", result.classification.reasons
    assert any("spin_forever" in f for f in result.classification.frames)
    assert result.path is not None
    assert "runs in spin_forever at deadlock_prog.py:" in (result.path / "summary.txt").read_text()


@needs_gdb
async def test_secrets_appear_nowhere_in_the_bundle(
    launch: Launcher, resume: ResumeLog, tmp_path: Path
) -> None:
    secrets = {
        "HF_TOKEN": "hf_secret123",
        "MY_API_KEY": "sk-mykey-98765",
        "DB_PASSWORD": "pw-db-777777",
        "DATABASE_URL": "postgres://bob:urlpass5555@db:5432/x",
    }
    env = {**os.environ, **secrets}
    tree = launch("deadlock", 1, env=env, extra=("--api-key", "sk-argv-4242"))
    req = request(
        tree.infos(),
        native=True,
        gdb=True,
        env=env,
        argv=("python3", "-m", "sglang.launch_server", "--api-key", "sk-argv-4242"),
        log_tail=(
            "server_args=ServerArgs(api_key='sk-argv-4242', hf_token=None)",
            "GET /v1/models Authorization: Bearer tok_header_31337",
            "loaded from postgres://bob:urlpass5555@db:5432/x",
            "echo hf_secret123",
        ),
        verdict={"reason": "stall", "env": {"DB_PASSWORD": "pw-db-777777"}},
    )
    result = await capture(req, tmp_path, py_spy_path=PY_SPY, resume=resume, **KEEP)
    assert result.path is not None
    needles = [*(v.encode() for v in secrets.values()), b"urlpass5555", b"sk-argv-4242", b"tok_header_31337"]
    files = [p for p in result.path.iterdir() if p.is_file()]
    assert len(files) >= 10
    for f in files:
        data = f.read_bytes()
        for needle in needles:
            assert needle not in data, f"{needle!r} leaked into {f.name}"
    assert b"[redacted]" in (result.path / "env.json").read_bytes()
    assert json.dumps(result.summary).find("sk-argv-4242") < 0


async def test_missing_tools_are_recorded_and_the_bundle_still_written(
    launch: Launcher, resume: ResumeLog, tmp_path: Path
) -> None:
    tree = launch("deadlock", 1)
    req = request(tree.infos(), native=True, gdb=True)
    result = await capture(
        req, tmp_path, py_spy_path=str(tmp_path / "no-py-spy"), gdb_path=str(tmp_path / "no-gdb"), **KEEP
    )
    assert result.path is not None and result.error is None
    for pid in tree.pids:
        assert tool(result, pid, "py-spy") == "missing"
        assert tool(result, pid, "gdb") == "missing"
    # /proc alone still shows threads parked on futexes.
    assert result.hang_class == "idle_deadlock"
    assert "py-spy: missing" in (result.path / "summary.txt").read_text()


def fake_tool(path: Path, body: str) -> str:
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def recording_cuda_gdb(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A cuda-gdb first on PATH that appends its arguments to the returned file (created only when it
    runs) and prints the synthetic collective trace."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "cuda-gdb.argv"
    fixture = Path(__file__).parent / "fixtures" / "synthetic-collective-cuda-gdb.txt"
    fake_tool(bin_dir / "cuda-gdb", f'echo "$*" >> {calls}\nexec /bin/cat {fixture}')
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}")
    return calls


async def test_a_tool_timeout_is_recorded_and_the_rest_goes_on(
    launch: Launcher, resume: ResumeLog, tmp_path: Path
) -> None:
    tree = launch("deadlock", 1)
    hanging = fake_tool(tmp_path / "py-spy", "echo 'Thread 1 (idle): \"partial\"'\nexec sleep 30")
    req = request(tree.infos(), native=False, gdb=False, py_spy_timeout_s=0.5)
    diag = tmp_path / "diag"
    result = await capture(req, diag, py_spy_path=hanging, resume=resume, **KEEP)
    assert [tool(result, pid, "py-spy") for pid in tree.pids] == ["timeout", "timeout"]
    assert result.duration_s < 5 and result.path is not None
    assert "partial" in (result.path / f"pyspy-{tree.children[0]}.txt").read_text()
    left = [p for p in psutil.Process().children(recursive=True) if p.name() == "sleep"]
    assert all(p.status() == psutil.STATUS_ZOMBIE for p in left)


@pytest.mark.skipif(shutil.which("setpriv") is None or os.geteuid() != 0, reason="needs root and setpriv")
async def test_ptrace_refusal_is_recorded_as_denied(
    launch: Launcher, resume: ResumeLog, tmp_path: Path
) -> None:
    tree = launch("deadlock", 1)
    drop = "setpriv --reuid=65534 --regid=65534 --clear-groups --inh-caps=-all --bounding-set=-all"
    spy = fake_tool(tmp_path / "py-spy", f'exec {drop} {PY_SPY} "$@"')
    gdb = fake_tool(tmp_path / "gdb", f'exec {drop} {shutil.which("gdb") or "gdb"} "$@"')
    req = request(tree.infos(), gdb=True)
    result = await capture(req, tmp_path / "diag", py_spy_path=spy, gdb_path=gdb, resume=resume, **KEEP)
    assert tool(result, tree.parent.pid, "py-spy") == "denied"
    if shutil.which("gdb"):
        assert tool(result, tree.parent.pid, "gdb") == "denied"
    assert result.path is not None


async def test_cuda_gdb_serves_where_gdb_is_missing(
    launch: Launcher, resume: ResumeLog, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tree = launch("deadlock", 1)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fixture = Path(__file__).parent / "fixtures" / "synthetic-collective-cuda-gdb.txt"
    # Prints the synthetic trace only when asked for the kernels, as cuda-gdb would.
    fake_tool(
        bin_dir / "cuda-gdb", f'case "$*" in *"info cuda kernels"*) exec /bin/cat {fixture};; esac\nexit 1'
    )
    monkeypatch.setenv("PATH", str(bin_dir))
    req = request(tree.infos()[1:], py_spy=False, gdb=True, gpu_util_percent=100.0)
    result = await capture(req, tmp_path / "diag", resume=resume, **KEEP)
    assert [t.tool for t in result.tools] == ["cuda-gdb"]
    assert result.hang_class == "collective"
    assert any("ncclDevKernel_AllReduce" in f for f in result.classification.frames)
    # No py-spy ran, so cuda-gdb is the only native view: it reads the libraries' symbols.
    assert result.path is not None
    pid = tree.infos()[1].pid
    assert "auto-solib-add" not in (result.path / f"gdb-{pid}.txt").read_text().splitlines()[0]


async def test_cuda_gdb_skips_library_symbols_once_py_spy_named_the_native_frames(
    launch: Launcher, resume: ResumeLog, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """cuda-gdb's attach to a torch process is 8 s with every library's symbols and 0.6 s without
    (H200); py-spy --native already named the host frames, so cuda-gdb is asked for the kernels."""
    tree = launch("deadlock", 1)
    calls = recording_cuda_gdb(tmp_path, monkeypatch)
    child = tree.infos()[1]
    req = request((child,), native=True, gdb=True, gpu_util_percent=100.0)
    result = await capture(req, tmp_path / "diag", py_spy_path=PY_SPY, resume=resume, **KEEP)
    assert tool(result, child.pid, "py-spy-native") == "ok"
    assert tool(result, child.pid, "cuda-gdb") == "ok"
    argv = calls.read_text().splitlines()
    assert len(argv) == 1 and "set auto-solib-add off" in argv[0] and "info cuda kernels" in argv[0]
    assert any("ncclDevKernel_AllReduce" in f for f in result.classification.frames)


async def test_manual_nonblocking_dump_pauses_nothing(
    launch: Launcher, resume: ResumeLog, tmp_path: Path
) -> None:
    tree = launch("deadlock", 1)
    gpu = GpuObservation("ok", "", (GpuDevice(0, "GPU-1", "H200", 3.0, 10, 100),))
    req = request(
        tree.infos(), trigger="manual", cause=None, native=True, gdb=False, nonblocking=True, gpu=gpu
    )
    result = await capture(req, tmp_path, py_spy_path=PY_SPY, resume=resume, **KEEP)
    child = tree.children[0]
    assert tool(result, child, "py-spy") == "ok"
    assert tool(result, child, "py-spy-native") == "skipped"
    assert tool(result, child, "gdb") == "absent"
    assert result.path is not None
    assert "--nonblocking" in (result.path / f"pyspy-{child}.txt").read_text().splitlines()[0]
    assert json.loads((result.path / "nvml.json").read_text())["devices"][0]["name"] == "H200"


async def test_a_process_that_is_gone(tmp_path: Path, proc_info: InfoFn) -> None:
    proc = psutil.Popen([sys.executable, "-c", "pass"])
    info = proc_info(proc.pid, "scheduler", 0)
    proc.wait()
    result = await capture(request((info,)), tmp_path, py_spy_path=PY_SPY, **KEEP)
    assert tool(result, proc.pid, "py-spy") == "gone"
    assert result.path is not None and "gone" in (result.path / f"proc-{proc.pid}.txt").read_text()


async def test_write_failure_is_returned_not_raised(tmp_path: Path, proc_info: InfoFn) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    req = request((proc_info(os.getpid(), "main", None),), py_spy=False)
    result = await capture(req, blocker / "diagnostics", **KEEP)
    assert result.path is None and result.error and "cannot write bundle" in result.error
    assert result.hang_class in ("idle_deadlock", "unknown", "busy_spin")
    assert result.summary["id"] == req.incident_id and result.error in str(result.summary["errors"])


async def test_full_disk_is_returned_not_raised(
    tmp_path: Path, proc_info: InfoFn, monkeypatch: pytest.MonkeyPatch
) -> None:
    from supervisor.diagnostics import bundle

    def enospc(path: Path, data: bytes) -> None:
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(bundle, "_write_file", enospc)
    req = request((proc_info(os.getpid(), "main", None),), py_spy=False)
    result = await capture(req, tmp_path, **KEEP)
    assert result.path is None and result.error is not None and "No space left" in result.error
    assert list(tmp_path.iterdir()) == []  # the partial bundle is gone
    assert result.summary["hang_class"] == result.hang_class


async def test_retention_runs_after_each_capture(tmp_path: Path, proc_info: InfoFn) -> None:
    info = proc_info(os.getpid(), "main", None)
    ids = []
    for i in range(3):
        req = request((info,), py_spy=False, incident_id=f"20261129T14450{i}Z-manual")
        result = await capture(req, tmp_path, keep=2, max_bytes=10**9)
        ids.append(result.id)
    assert result.removed == (ids[0],)
    assert sorted(p.name for p in tmp_path.iterdir()) == ids[1:]
    again = await capture(
        request((info,), py_spy=False, incident_id=ids[2]), tmp_path, keep=5, max_bytes=10**9
    )
    assert again.id == f"{ids[2]}-2"


@needs_gdb
async def test_a_sigstopped_scheduler_is_named_and_judged_from_the_schedulers(
    launch: Launcher, resume: ResumeLog, tmp_path: Path, wait_until: WaitFn
) -> None:
    """Real SGLang, one scheduler SIGSTOPped under load: the front end still burns a core. The
    class comes from the schedulers (idle), the bundle names the stopped rank, leaves it stopped."""
    tree = launch("front", 1)
    scheduler = tree.children[0]
    os.kill(scheduler, signal.SIGSTOP)
    assert wait_until(lambda: psutil.Process(scheduler).status() == psutil.STATUS_STOPPED, timeout=10)
    # The daemon passes the tree's CPU rate: the front end's spinning core.
    req = request(tree.infos(), cause="serving_stall", native=True, gdb=True, tree_cpu_cores=1.0)
    result = await capture(req, tmp_path, py_spy_path=PY_SPY, resume=resume, **KEEP)
    reasons = result.classification.reasons
    assert result.hang_class == "idle_deadlock", reasons
    assert "busy_spin" not in result.classification.candidates
    assert reasons[0].startswith(f"scheduler TP0 pid {scheduler} stopped (state T"), reasons
    assert psutil.Process(scheduler).status() == psutil.STATUS_STOPPED  # left as it was found
    assert all(scheduler not in call for call in resume.calls)
    assert tree.parent.pid in {pid for call in resume.calls for pid in call}  # the others still resumed
    assert result.path is not None
    doc = json.loads((result.path / "summary.json").read_text())
    assert doc["stopped"] == [scheduler]
    rows = {p["pid"]: p for p in doc["pids"]}
    assert rows[scheduler]["stopped"] and not rows[tree.parent.pid]["stopped"]
    assert rows[tree.parent.pid]["cpu_cores"] > 0.05 and rows[scheduler]["cpu_cores"] == 0.0  # a shared CPU
    text = (result.path / "summary.txt").read_text()
    assert f"pid {scheduler} scheduler TP0" in text and "STOPPED (state T before the capture" in text
    assert "is stopped (state T: SIGSTOP or a debugger)" in text


async def test_the_capture_budget_bounds_every_tool_and_skips_what_cannot_start(
    launch: Launcher, resume: ResumeLog, tmp_path: Path
) -> None:
    tree = launch("deadlock", 1)
    # A py-spy that never finishes and shrugs off SIGTERM: only the budget ends it.
    hanging = fake_tool(tmp_path / "py-spy", "trap '' TERM\necho 'Thread 1 (idle): \"partial\"'\nsleep 30 & wait")
    gdb = fake_tool(tmp_path / "gdb", "echo '#0  0x1 in never_run ()'")
    req = request(tree.infos(), gdb=True, py_spy_timeout_s=20.0, gdb_timeout_s=20.0, budget_s=1.0)
    result = await capture(req, tmp_path / "diag", py_spy_path=hanging, gdb_path=gdb, resume=resume, **KEEP)
    assert [tool(result, pid, "py-spy") for pid in tree.pids] == ["timeout", "timeout"]
    assert [tool(result, pid, "gdb") for pid in tree.pids] == ["skipped", "skipped"]
    assert all("budget" in t.detail for t in result.tools if t.outcome == "skipped")
    assert result.duration_s < 8, result.summary["durations"]  # 1 s budget, 1+2 s kill grace, the rest
    assert result.path is not None
    assert "partial" in (result.path / f"pyspy-{tree.children[0]}.txt").read_text()


async def test_cuda_gdb_only_for_the_processes_holding_gpu_memory(
    launch: Launcher, resume: ResumeLog, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tree = launch("deadlock", 1)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake_tool(bin_dir / "gdb", "echo 'Thread 1 (Thread 0x1 (LWP 1) \"python\"):'\necho '#0  0x1 in plain_gdb ()'")
    fake_tool(bin_dir / "cuda-gdb", "echo 'Thread 1 (Thread 0x1 (LWP 1) \"python\"):'\necho '#0  0x1 in cuda_gdb ()'")
    monkeypatch.setenv("PATH", str(bin_dir))
    child = tree.children[0]
    gpu = GpuObservation("ok", "", (GpuDevice(0, "GPU-1", "H200", 0.0, 10, 100),), (GpuProcess(child, 0, "GPU-1", 10),))
    req = request(tree.infos(), py_spy=False, gdb=True, gpu=gpu)
    result = await capture(req, tmp_path / "diag", resume=resume, **KEEP)
    assert tool(result, child, "cuda-gdb") == "ok" and tool(result, child, "gdb") == "absent"
    assert tool(result, tree.parent.pid, "gdb") == "ok" and tool(result, tree.parent.pid, "cuda-gdb") == "absent"


async def test_only_cuda_gdb_installed_skips_the_processes_without_gpu_memory(
    launch: Launcher, resume: ResumeLog, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tree = launch("deadlock", 1)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake_tool(bin_dir / "cuda-gdb", "echo 'Thread 1 (Thread 0x1 (LWP 1) \"python\"):'\necho '#0  0x1 in cuda_gdb ()'")
    monkeypatch.setenv("PATH", str(bin_dir))
    child = tree.children[0]
    gpu = GpuObservation("ok", "", (GpuDevice(0, "GPU-1", "H200", 0.0, 10, 100),), (GpuProcess(child, 0, "GPU-1", 10),))
    result = await capture(request(tree.infos(), py_spy=False, gdb=True, gpu=gpu), tmp_path / "diag", **KEEP)
    assert tool(result, child, "cuda-gdb") == "ok"
    assert tool(result, tree.parent.pid, "cuda-gdb") == "skipped"
    assert tool(result, tree.parent.pid, "gdb") == "absent"


@pytest.mark.parametrize(
    ("util", "read", "cuda_gdb_runs"),
    [
        (0.0, True, False),  # idle GPU: no kernel for cuda-gdb to name; pystack names every thread
        (100.0, True, True),  # a kernel resident (a spin, a collective): cuda-gdb names it
        (0.0, False, True),  # NVML could not read the utilisation (a MIG slice): not taken for idle
    ],
)
async def test_cuda_gdb_gives_way_to_pystack_on_an_idle_gpu(
    launch: Launcher,
    resume: ResumeLog,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    util: float,
    read: bool,
    cuda_gdb_runs: bool,
) -> None:
    """cuda-gdb took 4.9 s of the 7.2 s bundle of real SGLang's GIL hang on an idle H100 (issue 35):
    on a GPU at 0 % no kernel is resident, and pystack --native-all names the native frames of every
    thread, the C threads py-spy cannot list included (faulthandler's here; NCCL's and CUDA's there)."""
    tree = launch("deadlock", 1, env={**os.environ, "DEADLOCK_PROG_NATIVE_THREAD": "1"})
    calls = recording_cuda_gdb(tmp_path, monkeypatch)
    child = tree.infos()[1]
    device = GpuDevice(0, "GPU-1", "H100", util, 10, 100, util_read=read)
    gpu = GpuObservation("ok", "", (device,), (GpuProcess(child.pid, 0, "GPU-1", 10),))
    req = request((child,), native=True, gdb=True, gpu=gpu, gpu_util_percent=util)
    result = await capture(req, tmp_path / "diag", py_spy_path=PY_SPY, resume=resume, **KEEP)
    assert result.path is not None
    assert tool(result, child.pid, "py-spy-native") == "ok"
    # py-spy lists the Python threads only; the C thread is there for the kernel.
    spy_threads = (result.path / f"pyspy-native-{child.pid}.txt").read_text().count("\nThread ")
    assert psutil.Process(child.pid).num_threads() > spy_threads
    if cuda_gdb_runs:
        assert tool(result, child.pid, "cuda-gdb") == "ok" and calls.exists()
        assert tool(result, child.pid, "pystack-native") == "absent", result.tools
        return
    assert not calls.exists(), "cuda-gdb attached to a process on an idle GPU"
    assert tool(result, child.pid, "pystack-native") == "ok", result.tools
    (why,) = [t.detail for t in result.tools if t.pid == child.pid and t.tool == "cuda-gdb"]
    assert "0 % utilisation on GPU 0" in why and "pystack --native-all named" in why
    listed = (result.path / f"pystack-native-{child.pid}.txt").read_text().count("Traceback for thread ")
    assert listed == psutil.Process(child.pid).num_threads()
    assert result.hang_class == "idle_deadlock"
