"""A clean slate before every launch: what a killed SGLang leaves behind, found and judged.

SGLang 0.5.16 names its POSIX shared-memory segments (srt/utils/stale_shm_cleanup.py)
`sgl_shm_<kind>_<creator pid>_<rand>` (broadcast queues `mq`, multimodal `mm`, `nodecheck`,
CUDA-IPC `sync`) and `multi_tokenizer_args_<pid>`; its load snapshots are
`sglang_loads_<name>_<digest>.shm`, and older releases' broadcast queues Python's default
`psm_<hex>`. SGLang sweeps dead creators' segments only in its own CI; a SIGKILLed server (the
way its own kill_process_tree ends children) leaves them, and a full tmpfs kills the next server
with SIGBUS. A segment is removed only with proof that it is this daemon's and dead: SGLang's by
name, owned by this uid, mapped or held open by no live process, and made by this daemon's tree:
its creator pid (when the name has one) is gone and was a member of a tree this daemon launched, or
its tree was seen mapping it (supervisor.daemon.shmledger keeps both). A pid that merely reads as
gone proves nothing (another pid namespace's creator is invisible), and `psm_<hex>` is any Python
program's default name: without the ledger's proof either is kept.

Readers take their directories as arguments (tests use temp dirs); the decisions are pure.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from probes.proctree import MARKER_ENV, read_stat
from probes.types import GpuObservation
from supervisor.common.redact import Redactor, argv_secrets
from supervisor.engines import PROFILES

_WITH_PID = (
    re.compile(r"^sgl_shm_[A-Za-z0-9]+_(\d+)_[0-9a-fA-F]+$"),
    re.compile(r"^multi_tokenizer_args_(\d+)$"),
)
_WITHOUT_PID = re.compile(r"^(?:sglang_loads_.+\.shm|psm_[0-9a-fA-F]+)$")


@dataclass(frozen=True)
class ShmEntry:
    name: str
    size: int
    uid: int


@dataclass(frozen=True)
class StaleShm:
    name: str
    size: int
    why: str


def creator_pid(name: str) -> int | None:
    for pattern in _WITH_PID:
        m = pattern.match(name)
        if m:
            pid = int(m.group(1))
            return pid if pid > 0 else None
    return None


@dataclass(frozen=True)
class OursShm:
    """What proves a segment this daemon's: pids of trees it launched, names its trees mapped."""

    pids: frozenset[int]
    names: frozenset[str]


def stale_shm(
    entries: Iterable[ShmEntry], alive: Callable[[int], bool], in_use: Collection[str], uid: int, ours: OursShm
) -> list[StaleShm]:
    """This daemon's dead segments: SGLang's by name, of `uid`, not in use, and proven ours by
    `ours` (a pid-named one also needs its creator gone). A recycled pid reads as alive, which
    leaks a segment rather than removing a live one; anything unproven is kept."""
    out = []
    for e in entries:
        pid = creator_pid(e.name)
        if e.uid != uid or e.name in in_use or (pid is None and not _WITHOUT_PID.match(e.name)):
            continue
        if pid is not None:
            if not alive(pid) and (pid in ours.pids or e.name in ours.names):
                out.append(StaleShm(e.name, e.size, f"its creator pid {pid} (of this daemon's tree) is gone"))
        elif e.name in ours.names:
            out.append(StaleShm(e.name, e.size, "this daemon's tree mapped it; nothing maps it or holds it open now"))
    return out


def list_shm(shm_dir: Path) -> list[ShmEntry]:
    out = []
    try:
        with os.scandir(shm_dir) as it:
            for d in it:
                if creator_pid(d.name) is None and not _WITHOUT_PID.match(d.name):
                    continue
                try:
                    st = d.stat(follow_symlinks=False)
                except OSError:
                    continue
                out.append(ShmEntry(d.name, st.st_size, st.st_uid))
    except OSError:
        return []
    return out


def names_in_use(shm_dir: Path, proc_root: str = "/proc", pids: Iterable[int] | None = None) -> set[str]:
    """Files directly under `shm_dir` that some process (of `pids`, default every one) maps or
    holds open (/proc/*/maps, fd/)."""
    prefix = str(shm_dir).rstrip("/") + "/"
    found: set[str] = set()
    if pids is None:
        try:
            pids = [int(p) for p in os.listdir(proc_root) if p.isdigit()]
        except OSError:
            return found
    for pid in pids:
        try:
            with open(f"{proc_root}/{pid}/maps", "rb") as f:
                maps = f.read()
        except OSError:
            maps = b""
        # One search of the whole file, lines decoded only where the prefix is: a GPU server's
        # maps run to thousands of lines and few name the shm directory (issue 51).
        text = maps.decode("utf-8", "replace") if prefix.encode() in maps else ""
        at = text.find(prefix)
        while at >= 0:
            end = text.find("\n", at)
            line_end = len(text) if end < 0 else end
            found.add(text[at + len(prefix) : line_end].strip().removesuffix(" (deleted)"))
            at = text.find(prefix, line_end)
        try:
            for fd in os.listdir(f"{proc_root}/{pid}/fd"):
                target = os.readlink(f"{proc_root}/{pid}/fd/{fd}")
                if target.startswith(prefix):
                    found.add(target[len(prefix) :])
        except OSError:
            pass
    return found


def pid_alive(pid: int) -> bool:
    st = read_stat(pid)
    return st is not None and st.state not in ("Z", "X")


def remove_shm(shm_dir: Path, stale: Iterable[StaleShm]) -> tuple[list[StaleShm], list[str]]:
    removed, errors = [], []
    for s in stale:
        try:
            (shm_dir / s.name).unlink()
            removed.append(s)
        except FileNotFoundError:
            pass  # raced with another cleaner
        except OSError as err:
            errors.append(f"{shm_dir / s.name}: {err.strerror or err}")
    return removed, errors


# ---- GPU memory held outside the tree --------------------------------------------------------


@dataclass(frozen=True)
class GpuHolder:
    pid: int
    gpu: int
    used_bytes: int
    command: str
    ours: bool  # carries this daemon's marker: a process of one of its servers that outlived it


def gpu_holders(
    gpu: GpuObservation, exclude: Collection[int], gpus: Collection[int] | None, describe: Callable[[int], str]
) -> list[tuple[int, int, int, str]]:
    """(pid, gpu, bytes, command) of every process NVML lists on `gpus` (None: all) but `exclude`."""
    return [
        (p.pid, p.gpu_index, p.used_bytes, describe(p.pid))
        for p in gpu.processes
        if p.pid not in exclude and (gpus is None or p.gpu_index in gpus)
    ]


def command_of(pid: int, proc_root: str = "/proc") -> str:
    try:
        with open(f"{proc_root}/{pid}/cmdline", "rb") as f:
            argv = [a.decode("utf-8", "replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return "(gone, or another user's: its command cannot be read)"
    shown = Redactor.from_envs([], extra=argv_secrets(argv)).argv(argv)  # a stranger's --api-key stays out
    # One line whatever the argv holds (a `python -c` script's newlines, tabs): it goes into a reason.
    return " ".join(" ".join(shown).split())[:300] or "(no command line)"


def visible_gpus(env: Mapping[str, str], gpu: GpuObservation) -> frozenset[int] | None:
    """The NVML indices the server will use, from CUDA_VISIBLE_DEVICES (indices or UUIDs); None: all."""
    raw = env.get("CUDA_VISIBLE_DEVICES")
    if raw is None or not raw.strip():
        return None
    by_uuid = {d.uuid: d.index for d in gpu.devices}
    out = set()
    for item in raw.split(","):
        item = item.strip()
        if item.isdigit():
            out.add(int(item))
        elif item in by_uuid:
            out.add(by_uuid[item])
        else:
            return None  # MIG ids or a typo: the daemon does not guess
    return frozenset(out)


# ---- orphans of an earlier server of this state directory -------------------------------------


# The engines' child titles: an earlier server of either engine (a ladder may cross them).
_ORPHAN_TITLES = tuple(p.titles.prefix.encode() for p in PROFILES.values())


def orphans(
    state_dir: Path, exclude: Collection[int], parents: Collection[int] = (1,), proc_root: str = "/proc"
) -> list[int]:
    """`sglang::` (or vLLM's `VLLM::`) processes re-parented to init (or to the daemon, a subreaper:
    `parents`) whose output still goes to this state directory's logs: an earlier server of this
    state directory (its marker may be lost with state.json)."""
    logs = str(Path(state_dir).resolve()) + "/"
    found: list[int] = []
    try:
        pids = [int(p) for p in os.listdir(proc_root) if p.isdigit()]
    except OSError:
        return found
    for pid in pids:
        if pid in exclude:
            continue
        st = read_stat(pid, proc_root)
        if st is None or st.ppid not in parents or st.state in ("Z", "X"):
            continue
        try:
            with open(f"{proc_root}/{pid}/cmdline", "rb") as f:
                title = f.read(64)
        except OSError:
            continue
        if not title.startswith(_ORPHAN_TITLES):
            continue
        for fd in ("1", "2"):
            try:
                if os.readlink(f"{proc_root}/{pid}/fd/{fd}").startswith(logs):
                    found.append(pid)
                    break
            except OSError:
                continue
    return found


def carries(pid: int, marker: str, proc_root: str = "/proc") -> bool:
    try:
        with open(f"{proc_root}/{pid}/environ", "rb") as f:
            environ = f.read()
    except OSError:
        return False
    return f"{MARKER_ENV}={marker}".encode() in environ.split(b"\0")
