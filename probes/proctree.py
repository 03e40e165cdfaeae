"""The server's process tree, read straight from /proc: who belongs to it and what each member does.

Membership is the root and its descendants, plus any process whose environment carries the
supervisor's marker variable: a scheduler that called setsid, left the process group, or was
re-parented to init after the main process died is still ours. Every read tolerates a process
vanishing under it. `proc_root` is injectable so the parsing can be tested on a fixture tree.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from probes.types import ProcInfo, Role, ThreadInfo, TreeObservation
from supervisor.engines import SGLANG
from supervisor.engines.profile import Titles

MARKER_ENV = "SGLANG_SUPERVISOR_MARKER"

_CLK_TCK = os.sysconf("SC_CLK_TCK")
_PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")
_RANK = re.compile(r"_TP(\d+)")
# multiprocessing's "spawn" child before it runs its target (SGLang starts every child this way).
_SPAWN_BOOTSTRAP = "from multiprocessing.spawn import spawn_main"
_CHUNK = 16384
# A process this old when its environment was read without the marker will not gain it: only an exec
# changes the environment /proc shows, and an exec follows its fork at once (issue 51: the marker
# search read every process's environment on the host at every poll).
_MARK_SETTLED_S = 2.0

# psutil's names for the state letters of /proc/<pid>/stat.
_STATUS = {
    "R": "running",
    "S": "sleeping",
    "D": "disk-sleep",
    "T": "stopped",
    "t": "tracing-stop",
    "Z": "zombie",
    "X": "dead",
    "x": "dead",
    "K": "wake-kill",
    "W": "waking",
    "I": "idle",
    "P": "parked",
}


@dataclass(frozen=True)
class ProcStat:
    """The fields of /proc/<pid>/stat the supervisor uses; `starttime` plus `pid` is an identity."""

    pid: int
    comm: str
    state: str
    ppid: int
    pgid: int
    sid: int
    utime_ticks: int
    stime_ticks: int
    num_threads: int
    starttime: int  # clock ticks after boot: tells a reused pid from the process we saw
    rss_pages: int

    @property
    def cpu_time_s(self) -> float:
        return (self.utime_ticks + self.stime_ticks) / _CLK_TCK

    @property
    def zombie(self) -> bool:
        return self.state in ("Z", "X", "x")


def _read_bytes(path: str) -> bytes | None:
    """The whole file, or None. os.open/os.read, not `open()`: the file object and its buffer cost
    more than the read for /proc's small files, and the scan reads one per process on the host."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # vanished, a kernel thread, or not ours to read
        return None
    try:
        first = os.read(fd, _CHUNK)
        if len(first) < _CHUNK:
            return first
        parts = [first]
        while chunk := os.read(fd, _CHUNK):
            parts.append(chunk)
        return b"".join(parts)
    except OSError:
        return None
    finally:
        os.close(fd)


def _read_text(path: str) -> str | None:
    data = _read_bytes(path)
    return None if data is None else data.decode("utf-8", "replace")


def parse_stat(pid: int, text: str) -> ProcStat | None:
    # comm sits in parentheses and may itself contain spaces and parentheses.
    open_paren, close_paren = text.find("("), text.rfind(")")
    if open_paren < 0 or close_paren < open_paren:
        return None
    fields = text[close_paren + 2 :].split()
    try:
        return ProcStat(
            pid=pid,
            comm=text[open_paren + 1 : close_paren],
            state=fields[0],
            ppid=int(fields[1]),
            pgid=int(fields[2]),
            sid=int(fields[3]),
            utime_ticks=int(fields[11]),
            stime_ticks=int(fields[12]),
            num_threads=int(fields[17]),
            starttime=int(fields[19]),
            rss_pages=int(fields[21]),
        )
    except (IndexError, ValueError):
        return None


def read_stat(pid: int, proc_root: str = "/proc") -> ProcStat | None:
    """The process's stat line, or None when it is gone."""
    text = _read_text(f"{proc_root}/{pid}/stat")
    return None if text is None else parse_stat(pid, text)


def carries_marker(pid: int, marker: str, proc_root: str = "/proc") -> bool:
    environ = _read_bytes(f"{proc_root}/{pid}/environ")
    return bool(environ) and _marked(environ or b"", marker)


def _marked(environ: bytes, marker: str) -> bool:
    return b"\0" + f"{MARKER_ENV}={marker}".encode() + b"\0" in b"\0" + environ + b"\0"


def _all_pids(proc_root: str) -> list[int]:
    try:
        return [int(name) for name in os.listdir(proc_root) if name.isdigit()]
    except OSError:
        return []


def scan_tree(
    root_pid: int | None,
    marker: str | None,
    proc_root: str = "/proc",
    *,
    known: Mapping[int, int] | None = None,
    unmarked: set[tuple[int, int]] | None = None,
) -> dict[int, ProcStat]:
    """Members of the tree by pid, zombies included; the calling process and its ancestors excluded.

    `known` maps pids seen as members earlier to their `starttime`: those still alive with the same
    start time stay members even if their environment no longer shows the marker. One pass over
    /proc/*/stat builds the parent map; /proc/<pid>/environ is read only for processes that are
    not already members, so the scan costs a few milliseconds. `unmarked`, kept by the caller from
    scan to scan: the (pid, start time) of processes whose environment was read without the marker
    when they were already `_MARK_SETTLED_S` old; they are not read again (the scan updates it).
    """
    # One read of each stat; only the parent and start time are parsed for every process, the
    # whole line only for members (most of the host is not the tree).
    texts: dict[int, bytes] = {}
    parents: dict[int, int] = {}
    starts: dict[int, int] = {}
    children: dict[int, list[int]] = {}
    for pid in _all_pids(proc_root):
        raw = _read_bytes(f"{proc_root}/{pid}/stat")
        if raw is None:
            continue
        fields = raw[raw.rfind(b")") + 2 :].split()
        if raw.find(b"(") < 0 or len(fields) <= 21:
            continue
        try:
            ppid, start = int(fields[1]), int(fields[19])
        except ValueError:
            continue
        texts[pid], parents[pid], starts[pid] = raw, ppid, start
        children.setdefault(ppid, []).append(pid)

    seeds = [pid for pid, start in (known or {}).items() if starts.get(pid) == start]
    if root_pid is not None and root_pid in texts:
        seeds.append(root_pid)
    members = _descendants(seeds, children)
    if marker:
        settled = _settled_before(proc_root)
        was_unmarked = unmarked if unmarked is not None else set()
        now_unmarked: set[tuple[int, int]] = set()
        marked = []
        for pid, ppid in parents.items():
            if pid in members or ppid == 2 or pid == 2:
                continue
            key = (pid, starts[pid])
            if key in was_unmarked:
                now_unmarked.add(key)
                continue
            environ = _read_bytes(f"{proc_root}/{pid}/environ")
            if environ and _marked(environ, marker):
                marked.append(pid)
            elif environ and starts[pid] <= settled:
                now_unmarked.add(key)
        if unmarked is not None:
            unmarked.clear()
            unmarked.update(now_unmarked)
        members |= _descendants(marked, children)
    members -= _self_and_ancestors(parents)
    out: dict[int, ProcStat] = {}
    for pid in sorted(members):
        st = parse_stat(pid, texts[pid].decode("utf-8", "replace"))
        if st is not None:
            out[pid] = st
    return out


def _settled_before(proc_root: str) -> float:
    """The start time (clock ticks after boot) before which a process is `_MARK_SETTLED_S` old."""
    raw = _read_bytes(f"{proc_root}/uptime")
    try:
        uptime = float(raw.split()[0]) if raw else 0.0
    except (IndexError, ValueError):
        uptime = 0.0
    return (uptime - _MARK_SETTLED_S) * _CLK_TCK


def _self_and_ancestors(parents: Mapping[int, int]) -> set[int]:
    chain: set[int] = set()
    pid = os.getpid()
    while pid > 0 and pid not in chain:
        chain.add(pid)
        pid = parents.get(pid, 0)
    return chain


def _descendants(seeds: Iterable[int], children: dict[int, list[int]]) -> set[int]:
    found: set[int] = set()
    stack = list(seeds)
    while stack:
        pid = stack.pop()
        if pid in found:
            continue
        found.add(pid)
        stack.extend(children.get(pid, ()))
    return found


def find_tree(root_pid: int | None, marker: str | None, proc_root: str = "/proc") -> list[int]:
    """Pids of the root, its descendants and every process carrying the marker (zombies included)."""
    return list(scan_tree(root_pid, marker, proc_root))


def title_of(pid: int, comm: str, proc_root: str = "/proc") -> str:
    raw = _read_bytes(f"{proc_root}/{pid}/cmdline")
    # setproctitle pads the argv area with NULs, or (as real SGLang's children show) with spaces.
    parts = [p for p in (raw or b"").split(b"\0") if p.strip()]
    return b" ".join(parts).decode("utf-8", "replace").rstrip() if parts else comm


def role_of(
    title: str, is_root: bool, root_title: str | None = None, titles: Titles = SGLANG.titles
) -> tuple[Role, int | None]:
    """The process's role and tensor-parallel rank, from its title (the engine's names: `titles`).

    SGLang names a scheduler `sglang::scheduler` with no suffix at tp-size 1, so a rank process
    without `_TPn` is rank 0. A child sets its title only once it has imported the engine (tens of
    seconds); until then it shows Python's spawn bootstrap or its parent's command line, and is
    `pending`: one of the server's own children, role not known yet.
    """
    if is_root:
        return "main", None
    if title.startswith(titles.rank):
        match = _RANK.search(title)
        return "scheduler", int(match.group(1)) if match else 0
    if _SPAWN_BOOTSTRAP in title or (root_title is not None and title == root_title):
        return "pending", None
    if titles.detokenizer and title.startswith(titles.detokenizer):
        return "detokenizer", None
    if titles.controller and title.startswith(titles.controller):
        return "controller", None
    return "other", None


def _alone_rank(infos: list[ProcInfo], titles: Titles) -> list[ProcInfo]:
    """An engine whose one process runs the model itself when there is no rank process (vLLM's
    EngineCore at tp 1): that process is rank 0, so a lost rank and the culprit's rank are seen."""
    if not titles.rank_when_alone or any(p.role == "scheduler" for p in infos):
        return infos
    for i, p in enumerate(infos):
        if p.role != "main" and p.title.startswith(titles.rank_when_alone):
            return [*infos[:i], replace(p, role="scheduler", rank=0), *infos[i + 1 :]]
    return infos


def parse_io(text: str) -> tuple[int, int]:
    values: dict[str, int] = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        try:
            values[key.strip()] = int(value)
        except ValueError:
            continue
    return values.get("rchar", 0), values.get("wchar", 0)


class ProcessTreeProbe:
    """Observes the tree: per process and summed CPU time, RSS, bytes read, threads and wait channels.

    Blocking (a few ms, more with many threads): call it from a worker thread.
    """

    def __init__(self, proc_root: str = "/proc", *, with_threads: bool = True, titles: Titles = SGLANG.titles) -> None:
        self._proc = proc_root
        self._with_threads = with_threads
        self.titles = titles
        self._unmarked: set[tuple[int, int]] = set()  # scan_tree's, from poll to poll
        self._marker: str | None = None

    def observe(self, root_pid: int | None, marker: str | None, root_exit: int | None = None) -> TreeObservation:
        if marker != self._marker:  # another marker: every process is looked at again
            self._unmarked.clear()
            self._marker = marker
        stats = scan_tree(root_pid, marker, self._proc, unmarked=self._unmarked)
        root_title = title_of(root_pid, stats[root_pid].comm, self._proc) if root_pid in stats else None
        infos = [info for st in stats.values() if (info := self._proc_info(st, root_pid, root_title)) is not None]
        infos = _alone_rank(infos, self.titles)
        root = next((p for p in infos if p.pid == root_pid), None)
        return TreeObservation(
            root_pid=root_pid,
            root_alive=root is not None and root.status not in ("zombie", "dead"),
            root_exit=root_exit,
            processes=tuple(infos),
            cpu_time_s=sum(p.cpu_time_s for p in infos),
            rss_bytes=sum(p.rss_bytes for p in infos),
            read_chars=sum(p.read_chars for p in infos),
            write_chars=sum(p.write_chars for p in infos),
        )

    def _proc_info(self, st: ProcStat, root_pid: int | None, root_title: str | None = None) -> ProcInfo | None:
        # Re-read stat: the scan's copy may be a few milliseconds old and the process gone.
        fresh = read_stat(st.pid, self._proc)
        if fresh is None or fresh.starttime != st.starttime:
            return None
        title = title_of(fresh.pid, fresh.comm, self._proc)
        is_root = fresh.pid == root_pid
        role, rank = role_of(title, is_root, root_title if fresh.ppid == root_pid else None, self.titles)
        io_text = _read_text(f"{self._proc}/{fresh.pid}/io")
        read_chars, write_chars = parse_io(io_text) if io_text else (0, 0)
        return ProcInfo(
            pid=fresh.pid,
            ppid=fresh.ppid,
            title=title,
            status=_STATUS.get(fresh.state, fresh.state),
            role=role,
            rank=rank,
            cpu_time_s=fresh.cpu_time_s,
            rss_bytes=fresh.rss_pages * _PAGE_SIZE,
            read_chars=read_chars,
            write_chars=write_chars,
            num_threads=fresh.num_threads,
            threads=self._threads(fresh.pid) if self._with_threads else (),
            sid=fresh.sid,
            pgid=fresh.pgid,
        )

    def _threads(self, pid: int) -> tuple[ThreadInfo, ...]:
        task_dir = f"{self._proc}/{pid}/task"
        try:
            tids = sorted(int(t) for t in os.listdir(task_dir) if t.isdigit())
        except OSError:
            return ()
        threads: list[ThreadInfo] = []
        for tid in tids:
            st = read_stat(tid, task_dir)
            if st is None:
                continue
            name = _read_text(f"{task_dir}/{tid}/comm")
            wchan = _read_text(f"{task_dir}/{tid}/wchan")
            threads.append(
                ThreadInfo(
                    tid=tid,
                    name=(name or st.comm).rstrip("\n"),
                    state=st.state,
                    wchan=(wchan or "").strip(),
                )
            )
        return tuple(threads)
