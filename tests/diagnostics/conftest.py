"""A real process tree from deadlock_prog.py (deadlocked or spinning), cleaned up after each test."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest

from probes.types import ProcInfo
from supervisor.diagnostics.procinfo import sample_threads

PROG = Path(__file__).parent / "deadlock_prog.py"


def _proc_info(pid: int, role: str, rank: int | None) -> ProcInfo:
    p = psutil.Process(pid)
    cpu = p.cpu_times()
    return ProcInfo(
        pid=pid,
        ppid=p.ppid(),
        title=" ".join(p.cmdline()),
        status=p.status(),
        role=role,  # type: ignore[arg-type]
        rank=rank,
        cpu_time_s=cpu.user + cpu.system,
        rss_bytes=p.memory_info().rss,
        read_chars=0,
        write_chars=0,
        num_threads=p.num_threads(),
        threads=sample_threads(pid),
    )


InfoFn = Callable[[int, str, "int | None"], ProcInfo]


@pytest.fixture
def proc_info() -> InfoFn:
    """`proc_info(pid, role, rank)`: a ProcInfo of a live process, as the tree probe would give."""
    return _proc_info


@dataclass
class Tree:
    parent: subprocess.Popen[str]
    children: list[int]

    @property
    def pids(self) -> list[int]:
        return [self.parent.pid, *self.children]

    def infos(self) -> tuple[ProcInfo, ...]:
        main = _proc_info(self.parent.pid, "main", None)
        return (main, *(_proc_info(pid, "scheduler", i) for i, pid in enumerate(self.children)))


@dataclass
class Launcher:
    trees: list[Tree] = field(default_factory=list)

    def __call__(self, mode: str, count: int, env: Mapping[str, str] | None = None,
                 extra: Sequence[str] = ()) -> Tree:  # fmt: skip
        proc = subprocess.Popen(
            [sys.executable, str(PROG), mode, str(count), *extra],
            stdout=subprocess.PIPE,
            text=True,
            env=dict(env) if env is not None else None,
        )
        tree = Tree(proc, [])
        self.trees.append(tree)
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("ready"), line
        tree.children = [int(x) for x in line.split()[1:]]
        return tree

    def cleanup(self) -> None:
        for tree in self.trees:
            # By id, children first: the parent, joining them, reaps them.
            children = []
            for pid in tree.children:
                with contextlib.suppress(psutil.Error):
                    p = psutil.Process(pid)
                    p.resume()
                    p.kill()
                    children.append(p)
            psutil.wait_procs(children, timeout=5)
            with contextlib.suppress(psutil.Error):
                psutil.Process(tree.parent.pid).resume()
            tree.parent.kill()
            tree.parent.wait(10)
            if tree.parent.stdout is not None:
                tree.parent.stdout.close()


@pytest.fixture
def launch() -> Iterator[Launcher]:
    """`launch("deadlock" | "busy", n_children, env=None, extra=())`: a running tree; killed afterwards."""
    launcher = Launcher()
    try:
        yield launcher
    finally:
        launcher.cleanup()


@dataclass
class ResumeLog:
    calls: list[tuple[int, ...]] = field(default_factory=list)

    def __call__(self, pids: Sequence[int]) -> list[int]:
        """What supervisor.process.resume_stopped does, for the test's own children only."""
        self.calls.append(tuple(pids))
        resumed = []
        for pid in pids:
            with contextlib.suppress(psutil.Error):
                p = psutil.Process(pid)
                if p.status() in (psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP):
                    p.resume()
                    resumed.append(pid)
        return resumed


@pytest.fixture
def resume() -> ResumeLog:
    return ResumeLog()
