"""PyTorch's NCCL Flight Recorder in every hang's bundle (issue 35).

torch keeps a ring of each rank's recent collectives when the rank starts with a trace buffer
(`TORCH_NCCL_TRACE_BUFFER_SIZE`, `TORCH_FR_BUFFER_SIZE` in newer torch). With
`TORCH_NCCL_DEBUG_INFO_PIPE_FILE=<stem>` each rank makes a FIFO `<stem><rank>.pipe`; writing to it
makes that rank dump its ring to `TORCH_NCCL_DEBUG_INFO_TEMP_FILE<rank>` while it keeps running.
The pipe is read every second only with `TORCH_NCCL_DUMP_ON_TIMEOUT=1` (otherwise at each heartbeat
timeout, 480 s). So:

1. `launch_env` adds those variables to the server's environment, unless the operator set them;
2. at a capture, `trigger` writes every rank's pipe before any debugger attaches (a debugger stops
   the thread that would dump), and `wait_dumps` waits, bounded, for the dumps to settle;
3. the dumps are kept in the bundle and read by the SERVER's Python (`frdump.py`, a child process:
   the daemon never unpickles); torch's own analyzer (`torch.distributed.flight_recorder.fr_trace`),
   which imports torch (3-11 s), runs over the bundle's dumps after the bundle is written, where the
   server's Python has it (`frtrace.py`), so it never holds up the restart;
4. `judge` (pure) says which collective, which process group and sequence number, which ranks are
   missing or lagging, and says plainly when FR had nothing (no torch.distributed collective in
   flight: pynccl, custom all-reduce and CUDA-graph replays are not recorded).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import os
import re
import shutil
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

PIPE_STEM = "pipe_rank_"  # torch appends "<rank>.pipe"
DUMP_STEM = "nccl_trace_rank_"  # torch appends "<rank>"
BUFFER_KEYS = ("TORCH_NCCL_TRACE_BUFFER_SIZE", "TORCH_FR_BUFFER_SIZE")
PIPE_KEY = "TORCH_NCCL_DEBUG_INFO_PIPE_FILE"
DUMP_KEY = "TORCH_NCCL_DEBUG_INFO_TEMP_FILE"
ON_TIMEOUT_KEY = "TORCH_NCCL_DUMP_ON_TIMEOUT"
_PIPE = re.compile(r"(\d+)\.pipe$")
_DUMP = re.compile(r"(\d+)$")
ANALYZER_TIMEOUT_S = 15.0
SETTLE_S = 0.3  # a dump whose size has not changed for this long is complete
MAX_DUMP_BYTES = 64 * 1024 * 1024

FrStatus = Literal[
    "ok",  # dumps came back and were read
    "nothing",  # no rank had a pipe open (no torch.distributed NCCL group, or FR not enabled)
    "no_dumps",  # pipes were written, no dump came within the wait
    "off",  # [diagnostics] flight_recorder = false, or the operator pointed the files elsewhere
    "error",  # the analyzer could not run (no server Python, timeout, garbage)
    "stopped",  # every rank was stopped (state T) before the capture: none could read its pipe
]


def launch_env(server_env: Mapping[str, str], fr_dir: Path | None, entries: int) -> dict[str, str]:
    """The variables to add to a server's environment: the buffer, the pipe, the dump file and
    dump-on-timeout, each only where the operator did not set it (a buffer size set by either name
    counts as set). `fr_dir` None: off. Creates `fr_dir`; never raises (a directory that cannot be
    made leaves FR off for this launch)."""
    if fr_dir is None:
        return {}
    try:
        fr_dir.mkdir(parents=True, exist_ok=True)
    except OSError:
        return {}
    add: dict[str, str] = {}
    if not any(k in server_env for k in BUFFER_KEYS):
        add.update(dict.fromkeys(BUFFER_KEYS, str(entries)))
    defaults = {PIPE_KEY: str(fr_dir / PIPE_STEM), DUMP_KEY: str(fr_dir / DUMP_STEM), ON_TIMEOUT_KEY: "1"}
    add.update({k: v for k, v in defaults.items() if k not in server_env})
    return add


def paths_from(env: Mapping[str, str]) -> tuple[str, str] | None:
    """(pipe stem, dump stem) the server really got, or None when it has no pipe."""
    pipe = env.get(PIPE_KEY)
    if not pipe:
        return None
    return pipe, env.get(DUMP_KEY) or "/tmp/nccl_trace_rank_"


@dataclass(frozen=True)
class Pipe:
    rank: int
    path: str
    outcome: str  # "written", "no reader" (the rank is gone or never opened it), or the OS error


def trigger(pipe_stem: str) -> tuple[tuple[Pipe, ...], float]:
    """Write every rank's pipe, without blocking (a FIFO with no reader is `no reader`); returns the
    pipes and the wall time of the write (dumps older than that are stale)."""
    at = time.time()
    folder, stem = os.path.split(pipe_stem)
    out: list[Pipe] = []
    try:
        names = sorted(os.listdir(folder or "."))
    except OSError:
        return (), at
    for name in names:
        m = _PIPE.search(name)
        if not name.startswith(stem) or m is None or name[len(stem) : m.start()]:
            continue
        path = os.path.join(folder, name)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as err:
            why = "no reader" if err.errno == errno.ENXIO else err.strerror or str(err)
            out.append(Pipe(int(m.group(1)), path, why))
            continue
        try:
            os.write(fd, b"1\n")
            out.append(Pipe(int(m.group(1)), path, "written"))
        except OSError as err:
            out.append(Pipe(int(m.group(1)), path, err.strerror or str(err)))
        finally:
            os.close(fd)
    return tuple(out), at


def _fresh_dumps(dump_stem: str, since: float) -> dict[int, tuple[str, int]]:
    folder, stem = os.path.split(dump_stem)
    found: dict[int, tuple[str, int]] = {}
    with contextlib.suppress(OSError):
        for name in os.listdir(folder or "."):
            m = _DUMP.search(name)
            if not name.startswith(stem) or m is None or name[len(stem) : m.start()]:
                continue
            path = os.path.join(folder, name)
            with contextlib.suppress(OSError):
                st = os.stat(path)
                if st.st_mtime >= since - 1.0 and st.st_size > 0:
                    found[int(m.group(1))] = (path, st.st_size)
    return found


async def wait_dumps(dump_stem: str, ranks: Sequence[int], since: float, timeout_s: float) -> dict[int, str]:
    """Dumps written since `since`, once every rank of `ranks` has one that stopped growing, or at
    `timeout_s` (what came by then)."""
    end = time.monotonic() + timeout_s
    last: dict[int, tuple[str, int]] = {}
    stable_since = time.monotonic()
    while True:
        now = _fresh_dumps(dump_stem, since)
        if now != last:
            last, stable_since = now, time.monotonic()
        done = set(ranks) <= set(last) and time.monotonic() - stable_since >= SETTLE_S
        if done or time.monotonic() >= end:
            return {r: p for r, (p, _) in sorted(last.items())}
        await asyncio.sleep(0.1)


@dataclass(frozen=True)
class FrEntry:
    pg: str
    seq: int
    name: str
    state: str
    p2p: bool = False


@dataclass(frozen=True)
class FrDump:
    rank: int
    entries: tuple[FrEntry, ...] = ()
    error: str = ""


@dataclass(frozen=True)
class FrVerdict:
    mismatch: str  # "missing_ranks", "lagging_ranks", "collective_mismatch", "in_flight", "none_in_flight"
    collective: str | None  # "nccl:all_reduce"
    pg: str | None
    seq: int | None
    missing_ranks: tuple[int, ...]
    lagging_ranks: tuple[int, ...]
    text: str


def _int(v: object) -> int:
    return v if isinstance(v, int) and not isinstance(v, bool) else 0


def parse_dumps(raw: str) -> tuple[FrDump, ...]:
    """frdump.py's JSON (raises ValueError on anything else)."""
    doc = json.loads(raw)
    if not isinstance(doc, dict) or not isinstance(doc.get("dumps"), list):
        raise ValueError("no 'dumps' list")
    out: list[FrDump] = []
    for d in doc["dumps"]:
        if not isinstance(d, dict) or not isinstance(d.get("rank"), int):
            continue
        entries = tuple(
            FrEntry(
                str(e.get("pg", "?")),
                _int(e.get("seq")),
                str(e.get("name", "?")),
                str(e.get("state", "?")),
                bool(e.get("p2p")),
            )
            for e in d.get("entries") or []
            if isinstance(e, dict)
        )
        out.append(FrDump(d["rank"], entries, str(d.get("error") or "")))
    return tuple(out)


def judge(dumps: Sequence[FrDump], expected: Sequence[int]) -> FrVerdict:
    """Pure: what the ranks' rings say about the hang. Per process group, the last collective each
    rank issued (by sequence number): a rank with no dump is missing, a rank behind the others is
    lagging (the one they wait for), ranks at the same number with different collectives are a
    mismatch, all at the same one not completed is a collective in flight; all completed: FR had
    nothing (the hang is not in a torch.distributed collective)."""
    have = {d.rank for d in dumps if not d.error}
    missing = tuple(sorted(set(expected) - have))
    last: dict[str, dict[int, FrEntry]] = {}
    for d in dumps:
        for e in d.entries:
            if e.p2p:
                continue
            mine = last.setdefault(e.pg, {})
            if d.rank not in mine or e.seq >= mine[d.rank].seq:
                mine[d.rank] = e
    worst: FrVerdict | None = None
    for pg, by_rank in sorted(last.items()):
        top = max(e.seq for e in by_rank.values())
        lead = [e for e in by_rank.values() if e.seq == top]
        behind = tuple(sorted(r for r, e in by_rank.items() if e.seq < top))
        names = sorted({e.name for e in lead})
        open_ = [e for e in lead if e.state != "completed"]
        what = names[0] if names else None
        if behind:
            text = (
                f"ranks {', '.join(str(r) for r, e in by_rank.items() if e.seq == top)} issued {what} #{top} "
                f"in process group {pg}; rank(s) {', '.join(map(str, behind))} stopped before it "
                f"(at #{min(by_rank[r].seq for r in behind)}): the rank(s) the others wait for"
            )
            v = FrVerdict("lagging_ranks", what, pg, top, missing, behind, text)
        elif len(names) > 1:
            text = f"at #{top} of process group {pg} the ranks issued different collectives: {', '.join(names)}"
            v = FrVerdict("collective_mismatch", what, pg, top, missing, (), text)
        elif open_:
            text = f"every rank is inside {what} #{top} of process group {pg}, not completed ({open_[0].state})"
            v = FrVerdict("in_flight", what, pg, top, missing, (), text)
        else:
            continue
        order = ("lagging_ranks", "collective_mismatch", "in_flight")
        if worst is None or order.index(v.mismatch) < order.index(worst.mismatch):
            worst = v
    if missing and worst is None:
        text = f"rank(s) {', '.join(map(str, missing))} wrote no dump (gone, stopped, or not in a collective)"
        return FrVerdict("missing_ranks", None, None, None, missing, (), text)
    if worst is not None:
        if missing:
            worst = FrVerdict(
                worst.mismatch,
                worst.collective,
                worst.pg,
                worst.seq,
                missing,
                worst.lagging_ranks,
                f"{worst.text}; rank(s) {', '.join(map(str, missing))} wrote no dump",
            )
        return worst
    n = sum(len(d.entries) for d in dumps)
    text = (
        f"nothing in flight: every torch.distributed collective in the {len(dumps)} dump(s) ({n} entries) completed; "
        "the hang is outside torch.distributed (pynccl, custom all-reduce and CUDA-graph replays are not recorded)"
    )
    return FrVerdict("none_in_flight", None, None, None, (), (), text)


@dataclass(frozen=True)
class FrReport:
    status: FrStatus
    reason: str = ""
    pipes: tuple[Pipe, ...] = ()
    dumps: dict[int, str] = field(default_factory=dict)  # rank -> dump file on disk
    wait_s: float = 0.0
    verdict: FrVerdict | None = None
    analyzer: str = ""  # torch's fr_trace output, where the server's Python has it
    read: tuple[FrDump, ...] = ()

    def doc(self) -> dict[str, object]:
        v = self.verdict
        return {
            "status": self.status,
            "reason": self.reason,
            "pipes": {str(p.rank): p.outcome for p in self.pipes},
            "dump_ranks": sorted(self.dumps),
            "wait_s": self.wait_s,
            "mismatch": v.mismatch if v else None,
            "collective": v.collective if v else None,
            "process_group": v.pg if v else None,
            "seq": v.seq if v else None,
            "missing_ranks": list(v.missing_ranks) if v else [],
            "lagging_ranks": list(v.lagging_ranks) if v else [],
            "text": v.text if v else self.reason,
            "errors": [f"rank {d.rank}: {d.error}" for d in self.read if d.error],
        }

    def lines(self) -> list[str]:
        head = {
            "ok": "NCCL Flight Recorder",
            "nothing": "NCCL Flight Recorder: nothing",
            "no_dumps": "NCCL Flight Recorder: no dump",
            "off": "NCCL Flight Recorder: off",
            "error": "NCCL Flight Recorder: error",
            "stopped": "NCCL Flight Recorder: not asked",
        }[self.status]
        out = ["", f"{head} ({len(self.dumps)} of {len(self.pipes)} rank(s) dumped in {self.wait_s:.1f} s; fr-*)"]
        out.append(f"  {self.verdict.text if self.verdict else self.reason}")
        if self.status == "ok" and self.verdict is not None and not self.analyzer:
            out.append("  torch's analyzer (fr_trace) runs once this bundle is written: fr-trace.txt, when it finishes")
        return out


async def analyze(
    python: str, dumps: Mapping[int, str], env: Mapping[str, str], trace_s: float = ANALYZER_TIMEOUT_S
) -> tuple[tuple[FrDump, ...], str, str]:
    """(dumps as read, torch's fr_trace text, error) with the server's Python. The dumps are first
    copied into a folder only the daemon can write (the server cannot swap a file between the two
    reads); frdump.py reads the copies with a class-refusing unpickler; torch's analyzer, which
    unpickles with pickle's full loader, runs on those copies only when every one of them read as
    plain data (a pickle that loads with every class refused can run no code), and where the
    server's torch has it."""
    with tempfile.TemporaryDirectory(prefix="sglang-supervisor-fr-") as private:
        copies = await asyncio.to_thread(_copy_dumps, dumps, private)
        return await _analyze(python, copies, env, private, trace_s)


def _copy_dumps(dumps: Mapping[int, str], folder: str) -> list[str]:
    out = []
    for rank in sorted(dumps):
        dest = os.path.join(folder, f"{DUMP_STEM}{rank}")
        with contextlib.suppress(OSError), open(dumps[rank], "rb") as src, open(dest, "wb") as dst:
            dst.write(src.read(MAX_DUMP_BYTES + 1))
        if os.path.exists(dest):
            out.append(dest)
    return out


async def _analyze(
    python: str, files: Sequence[str], env: Mapping[str, str], folder: str, trace_s: float
) -> tuple[tuple[FrDump, ...], str, str]:
    script = str(Path(__file__).with_name("frdump.py"))
    out, err = await _run([python, "-I", script, *files], {"PATH": env.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C"})
    if err:
        return (), "", f"frdump with {python}: {err}"
    try:
        read = parse_dumps(out)
    except ValueError as e:
        return (), "", f"frdump with {python} printed no report: {e}"
    unsafe = [f"rank {d.rank}: {d.error}" for d in read if d.error]
    if trace_s <= 0 and not unsafe and len(read) == len(files):
        return read, "", ""  # torch's analyzer after the bundle (frtrace.py)
    if unsafe or len(read) != len(files):
        return read, f"torch's analyzer not run: not every dump read as plain data ({'; '.join(unsafe)[:300]})", ""
    fr_env = {k: v for k, v in env.items() if k in ("PATH", "PYTHONPATH", "LD_LIBRARY_PATH", "HOME")}
    fr_env["CUDA_VISIBLE_DEVICES"] = ""  # the analyzer needs no GPU
    argv = [python, "-m", "torch.distributed.flight_recorder.fr_trace", folder, "-p", DUMP_STEM]
    text, fr_err = await _run([*argv, "--allow-incomplete-ranks"], fr_env, trace_s)
    if not text and fr_err.startswith("took over"):
        fr_err = f"torch's analyzer did not finish within {trace_s:g} s (importing torch is most of it); not waited for"
    return read, (text or fr_err)[-65536:], ""


async def _run(argv: Sequence[str], env: Mapping[str, str], timeout_s: float = ANALYZER_TIMEOUT_S) -> tuple[str, str]:
    """(stdout, error) of one bounded child; the error is "" on exit 0."""
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=dict(env),
            start_new_session=True,
        )
    except OSError as e:
        return "", f"cannot run {argv[0]}: {e.strerror or e}"
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout_s)
    except asyncio.TimeoutError:  # not the builtin TimeoutError before Python 3.11
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, 9)  # our own child's session, never the server's
        await proc.wait()
        return "", f"took over {timeout_s:g} s"
    except asyncio.CancelledError:  # the daemon shutting down: the child goes with the task
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, 9)
        # Its exit seen before the task ends: a loop closed at once left the transport open.
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.shield(proc.wait()), 2.0)
        raise
    text = out.decode("utf-8", "replace")
    if proc.returncode != 0:
        tail = err.decode("utf-8", "replace").strip().splitlines()[-2:]
        return text, f"exit {proc.returncode}: {' | '.join(tail)[:300]}"
    return text, ""


def server_python(pids: Sequence[int], argv: Sequence[str], env: Mapping[str, str] | None = None) -> str | None:
    """The interpreter the server runs, as the server named it: the command's argv[0] when it is a
    Python (resolved on the server's PATH), else a rank's `/proc/<pid>/exe`. argv[0] first, because
    a virtual environment's `bin/python` is a symlink: `/proc/<pid>/exe` names the base interpreter,
    which runs without the environment's packages (no torch for the analyzer)."""
    if argv and "python" in os.path.basename(argv[0]):
        path = (env or {}).get("PATH") or os.environ.get("PATH")
        found = argv[0] if os.sep in argv[0] else shutil.which(argv[0], path=path)
        if found and os.access(found, os.X_OK):
            return os.path.abspath(found)
    for pid in pids:
        with contextlib.suppress(OSError):
            exe = os.readlink(f"/proc/{pid}/exe")
            if "python" in os.path.basename(exe) and os.access(exe, os.X_OK):
                return exe
    return None


async def flight_dumps(env: Mapping[str, str], wait_s: float) -> FrReport:
    """Step 2 at a capture, before any debugger attaches: write the pipes, wait for the dumps. An
    `ok` report here has its dumps but no verdict yet: `flight_read` reads them, which needs no
    rank to run, so it goes alongside the tools instead of before them."""
    got = paths_from(env)
    if got is None:
        return FrReport("off", f"{PIPE_KEY} is not in the server's environment ([diagnostics] flight_recorder off)")
    pipe_stem, dump_stem = got
    tic = time.monotonic()
    pipes, at = await asyncio.to_thread(trigger, pipe_stem)
    written = [p.rank for p in pipes if p.outcome == "written"]
    if not written:
        why = "no rank had a Flight Recorder pipe open: no torch.distributed NCCL process group in the tree"
        if pipes:
            why += f" ({len(pipes)} stale pipe(s) with no reader)"
        return FrReport("nothing", why, pipes)
    dumps = await wait_dumps(dump_stem, written, at, wait_s)
    waited = round(time.monotonic() - tic, 2)
    if not dumps:
        why = f"{len(written)} pipe(s) written, no dump within {wait_s:g} s (a rank stopped, or torch too old)"
        return FrReport("no_dumps", why, pipes, {}, waited)
    return FrReport("ok", "", pipes, dumps, waited)


async def flight_read(
    report: FrReport,
    env: Mapping[str, str],
    rank_pids: Sequence[int],
    argv: Sequence[str],
    trace_s: float = ANALYZER_TIMEOUT_S,
) -> FrReport:
    """Steps 3-4: the dumps read by the server's Python and judged (a report without dumps as it is)."""
    if report.status != "ok" or not report.dumps or report.verdict is not None:
        return report
    python = server_python(rank_pids, argv, env)
    if python is None:
        return replace(report, status="error", reason="the server's Python could not be found to read the dumps")
    read, trace, err = await analyze(python, report.dumps, env, trace_s)
    if err:
        return replace(report, status="error", reason=err)
    written = [p.rank for p in report.pipes if p.outcome == "written"]
    return replace(report, verdict=judge(read, written), analyzer=trace, read=read)


async def flight_record(
    env: Mapping[str, str], rank_pids: Sequence[int], argv: Sequence[str], wait_s: float
) -> FrReport:
    """Steps 2-4 in one: write the pipes, wait for the dumps, read and judge them."""
    return await flight_read(await flight_dumps(env, wait_s), env, rank_pids, argv)


def bundle_files(report: FrReport) -> dict[str, bytes]:
    """The dumps (as torch wrote them) and torch's analyzer output, for the bundle."""
    out: dict[str, bytes] = {}
    for rank, path in report.dumps.items():
        with contextlib.suppress(OSError), open(path, "rb") as f:
            out[f"fr-dump-rank{rank}.pickle"] = f.read(MAX_DUMP_BYTES)
    if report.analyzer:
        out["fr-trace.txt"] = report.analyzer.encode()
    return out
