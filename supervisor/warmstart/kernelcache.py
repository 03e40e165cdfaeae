"""Kernel caches that survive relaunches (issue 36).

SGLang and its kernels compile into caches that default under `~/.cache` or `$TMPDIR` (lost with a
private /tmp, a fresh container or another user). Unless the operator set a variable, each is
pinned under `[paths] cache_dir/daemon-<identity>/<fingerprint>/` (one directory per model and rung
command line, shared by its relaunches; `daemon-<identity>` is this daemon's own, see cacheplace.py).
FlashInfer's variable is its workspace base (`FLASHINFER_WORKSPACE_BASE`; FlashInfer appends
`.cache/flashinfer`, flashinfer/jit/env.py).

A launch writes a marker (`LAUNCHING`, with the launch's wall time) into its directory and the
ready server clears it. A marker found at the next launch says a launch died before ready (an Xid,
a SIGKILL mid-compile, the daemon's stop of a hung start): whatever that launch wrote (files newer
than its marker) may be half-written, so it is moved to `set-aside/` beside the directory, never
silently reused and never deleted on a guess; what was there before that launch stays (it had been
complete since a launch reached ready). This daemon's caches are pruned to `[caches] max_gb` before
each launch, set-aside copies and the least recently used fingerprints first, never the fingerprint
about to launch, never a directory whose owner marker (`OWNER`) names another daemon.

Every path below the base is opened from a directory fd without following a link (issue 50): a link
found where a directory should be is left alone and reported, never walked, written through or
deleted.
"""


from __future__ import annotations

import contextlib
import json
import os
import re
import stat
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from supervisor.status.launchviews import CacheState, CacheView
from supervisor.warmstart.cacheplace import (
    O_DIR,
    PRIVATE_PREFIX,
    ROOT_PREFIX,
    Base,
    Refused,
    daemon_identity,
    opened,
)

# (variable, sub-directory under the fingerprint's directory)
CACHE_VARS: tuple[tuple[str, str], ...] = (
    ("TORCHINDUCTOR_CACHE_DIR", "torchinductor"),
    ("TRITON_CACHE_DIR", "triton"),
    ("TVM_FFI_CACHE_DIR", "tvm-ffi"),
    ("SGLANG_DG_CACHE_DIR", "deep_gemm"),
    ("TILELANG_CACHE_DIR", "tilelang"),
    ("FLASHINFER_WORKSPACE_BASE", "flashinfer"),
    ("CUTE_DSL_CACHE_DIR", "cute_dsl"),
    # vLLM keeps its torch.compile artifacts under it (`torch_compile_cache`); SGLang ignores it.
    ("VLLM_CACHE_ROOT", "vllm"),
)
MARKER = "LAUNCHING"
USED = "LAST_READY"  # touched at each ready: the prune's "least recently used"
OWNER = "OWNER"  # the identity of the daemon that made the directory (its state directory's)
SET_ASIDE = "set-aside"
OWN_FILES = (MARKER, USED, OWNER)
# A file's mtime within this of the marker's time counts as the crashed launch's (clock granularity).
MTIME_SLACK_S = 1.0
_PLAIN = re.compile(r"[0-9A-Za-z_][0-9A-Za-z_.-]*")


@dataclass(frozen=True)
class Home:
    """Where this daemon's caches are: `[paths] cache_dir`, its state directory (the identity), and
    whether directories of the layout before issue 50 found there are its own to adopt (only when
    `cache_dir` is the default, inside its state directory)."""

    cache_dir: Path
    state_dir: Path
    adopt_legacy: bool = False
    euid: int = field(default_factory=os.geteuid)


@dataclass(frozen=True)
class Prepared:
    env: dict[str, str]  # what the server's environment gets
    view: CacheView
    pruned: tuple[str, ...] = ()
    left_alone: tuple[str, ...] = ()  # links (or strangers) found where this module's directories go
    adopted: tuple[str, ...] = ()  # directories of the layout before issue 50 moved into this daemon's


# ---- directories by fd, never through a link --------------------------------------------------------


def _entries(fd: int) -> list[os.DirEntry[str]]:
    with os.scandir(fd) as it:
        return list(it)


def _open_at(parent: int, name: str) -> int | None:
    """`name` in `parent` as a directory fd; None when it is missing, a link or not a directory."""
    try:
        return os.open(name, O_DIR, dir_fd=parent)
    except OSError:
        return None


def _is_link(parent: int, name: str) -> bool:
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=parent, follow_symlinks=False).st_mode)
    except OSError:
        return False


def _dir_at(parent: int, name: str, where: str, *, create: bool) -> int:
    """`name` in `parent` as a directory fd (made 0700 when missing and `create`); Refused for a link."""
    if create:
        with contextlib.suppress(FileExistsError):
            os.mkdir(name, 0o700, dir_fd=parent)
    fd = _open_at(parent, name)
    if fd is not None:
        return fd
    if _is_link(parent, name):
        raise Refused(f"{where} is a symbolic link where a directory should be: left alone")
    raise Refused(f"{where} is missing or not a directory")


def _walk(fd: int, rel: str = "") -> Iterator[tuple[int, str, str, os.stat_result]]:
    """Every entry that is not a directory under `fd`: (its directory's fd, relative directory, name,
    lstat). Only real directories are entered (opened without following, checked to be the one listed)."""
    for e in _entries(fd):
        try:
            st = e.stat(follow_symlinks=False)
        except OSError:
            continue
        if not stat.S_ISDIR(st.st_mode):
            yield fd, rel, e.name, st
            continue
        sub = _open_at(fd, e.name)
        if sub is None:
            continue
        try:
            if os.path.samestat(st, os.fstat(sub)):
                yield from _walk(sub, f"{rel}{e.name}/")
        finally:
            os.close(sub)


def _size(fd: int) -> int:
    return sum(st.st_size for _, _, _, st in _walk(fd))


def _size_at(parent: int, name: str) -> int:
    fd = _open_at(parent, name)
    if fd is None:
        return 0
    try:
        return _size(fd)
    finally:
        os.close(fd)


def _rmtree_at(parent: int, name: str) -> None:
    """Remove the directory `name` in `parent` and what is in it, entering only real directories (a
    link is removed as a link, never followed): CPython's `_rmtree_safe_fd`, on any Python."""
    fd = _open_at(parent, name)
    if fd is None:
        return
    try:
        for e in _entries(fd):
            if e.is_dir(follow_symlinks=False):
                _rmtree_at(fd, e.name)
            else:
                with contextlib.suppress(OSError):
                    os.unlink(e.name, dir_fd=fd)
    finally:
        os.close(fd)
    with contextlib.suppress(OSError):
        os.rmdir(name, dir_fd=parent)


def _read_at(fd: int, name: str, limit: int = 4096) -> str | None:
    """A small regular file's text in the directory `fd`, never through a link; None if there is none."""
    try:
        f = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=fd)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(f).st_mode):
            return None
        return os.read(f, limit).decode("utf-8", "replace")
    finally:
        os.close(f)


def _write_at(fd: int, name: str, text: str) -> None:
    """Write `name` in the directory `fd` atomically (a temporary file, then a rename over it)."""
    tmp = f"{name}.tmp"
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp, dir_fd=fd)
    f = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=fd)
    try:
        os.write(f, text.encode())
    finally:
        os.close(f)
    os.replace(tmp, name, src_dir_fd=fd, dst_dir_fd=fd)


def _mtime_at(fd: int, name: str) -> float | None:
    try:
        st = os.stat(name, dir_fd=fd, follow_symlinks=False)
    except OSError:
        return None
    return st.st_mtime if stat.S_ISREG(st.st_mode) else None


# ---- a fingerprint's directory ----------------------------------------------------------------------


def _content_size(d: int) -> int:
    """Bytes of cache entries (the daemon's own marker files left out)."""
    return sum(st.st_size for _, rel, name, st in _walk(d) if rel or name not in OWN_FILES)


def _read_marker(d: int) -> float | None:
    """The launch time a marker records, or None when there is no marker (unreadable: its mtime)."""
    text = _read_at(d, MARKER)
    if text is None:
        return _mtime_at(d, MARKER)
    try:
        return float(json.loads(text)["launched_wall"])
    except (ValueError, KeyError, TypeError):
        return _mtime_at(d, MARKER)


def _owned(d: int, identity: str) -> bool:
    return (_read_at(d, OWNER) or "").strip() == identity


def _set_aside(own: int, own_path: str, d: int, fp: str, since_wall: float, now_wall: float) -> tuple[str, int]:
    """Move what a crashed launch wrote (files modified since `since_wall`) out of the fingerprint's
    directory `d` into `set-aside/<fp>-<time>/` of this daemon's directory, keeping relative paths.
    Returns (where, bytes moved)."""
    name = f"{fp}-{time.strftime('%Y%m%dT%H%M%S', time.gmtime(now_wall))}"
    dest = f"{own_path}/{SET_ASIDE}/{name}"
    moved = 0
    targets: dict[str, int] = {}  # relative directory -> its fd under the set-aside copy
    try:
        for fd, rel, fname, st in _walk(d):  # each fd is open while its entries are handed out
            if (not rel and fname in OWN_FILES) or st.st_mtime < since_wall - MTIME_SLACK_S:
                continue
            if rel not in targets:
                targets[rel] = _target(own, (SET_ASIDE, name, *rel.split("/")[:-1]))
            try:
                os.replace(fname, fname, src_dir_fd=fd, dst_dir_fd=targets[rel])
            except OSError:
                continue
            moved += st.st_size
    finally:
        for t in targets.values():
            os.close(t)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(MARKER, dir_fd=d)
    return (dest if moved else "", moved)


def _target(own: int, parts: tuple[str, ...]) -> int:
    """The directory `own/parts...` (made 0700 where missing), opened link by link never followed."""
    fd = os.dup(own)
    for i, part in enumerate(parts):
        try:
            nxt = _dir_at(fd, part, "/".join(parts[: i + 1]), create=True)
        finally:
            os.close(fd)
        fd = nxt
    return fd


def _prune(own: int, own_path: str, keep: str, max_bytes: int, identity: str) -> tuple[tuple[str, ...], list[str]]:
    """Remove set-aside copies (oldest first), then fingerprints by last ready (oldest first), until
    this daemon's caches are within `max_bytes`; never `keep`, never a directory whose owner marker
    does not name `identity`, never a link. Returns (removed, left alone)."""
    left: list[str] = []
    candidates: list[tuple[int, float, int, str, str]] = []  # (kind, age, parent fd, name, path)
    aside = _open_at(own, SET_ASIDE)
    if aside is None and _is_link(own, SET_ASIDE):
        left.append(f"{own_path}/{SET_ASIDE} is a symbolic link: left alone")
    opened_fds = [aside] if aside is not None else []
    try:
        for e in _entries(aside) if aside is not None else ():
            if aside is not None and e.is_dir(follow_symlinks=False):
                mtime = e.stat(follow_symlinks=False).st_mtime
                candidates.append((0, mtime, aside, e.name, f"{own_path}/{SET_ASIDE}/{e.name}"))
        for e in _entries(own):
            if e.name in (SET_ASIDE, keep):
                continue
            if e.is_symlink():
                left.append(f"{own_path}/{e.name} is a symbolic link: left alone")
                continue
            d = _open_at(own, e.name) if e.is_dir(follow_symlinks=False) else None
            if d is None:
                continue
            try:
                age = _mtime_at(d, USED) or _mtime_at(d, MARKER)
                if not _owned(d, identity):
                    left.append(f"{own_path}/{e.name} has no owner marker of this daemon: left alone")
                    continue
            finally:
                os.close(d)
            if age is not None:
                candidates.append((1, age, own, e.name, f"{own_path}/{e.name}"))
        total = _size(own)
        removed: list[str] = []
        for _kind, _age, parent, name, path in sorted(candidates, key=lambda c: (c[0], c[1])):
            if total <= max_bytes:
                break
            size = _size_at(parent, name)
            _rmtree_at(parent, name)
            total -= size
            removed.append(path)
        return tuple(removed), left
    finally:
        for fd in opened_fds:
            os.close(fd)


def _others(base: Base, own_name: str) -> tuple[int, int]:
    """Fingerprint directories in the base that are not this daemon's (other daemons' directories,
    and those of the layout before issue 50), and their bytes: read, never touched."""
    count = total = 0
    for e in _entries(base.fd):
        if e.name == own_name or not e.is_dir(follow_symlinks=False):
            continue
        d = _open_at(base.fd, e.name)
        if d is None:
            continue
        try:
            if e.name.startswith(ROOT_PREFIX):
                count += sum(1 for x in _entries(d) if x.name != SET_ASIDE and x.is_dir(follow_symlinks=False))
                total += _size(d)
            elif _legacy(d):
                count += 1
                total += _size(d)
        finally:
            os.close(d)
    return count, total


def _legacy(d: int) -> bool:
    """A fingerprint directory of the layout before issue 50 (directly in `cache_dir`, no owner marker)."""
    return _read_at(d, OWNER) is None and (_mtime_at(d, USED) is not None or _mtime_at(d, MARKER) is not None)


def _adopt(base: Base, own: int, identity: str, euid: int) -> tuple[str, ...]:
    """Move the fingerprints (and set-aside copies) of the layout before issue 50 into this daemon's
    directory: only in a `cache_dir` inside its own state directory, where they were its own."""
    adopted: list[str] = []
    for e in _entries(base.fd):
        if e.name.startswith((ROOT_PREFIX, PRIVATE_PREFIX)) or not e.is_dir(follow_symlinks=False):
            continue
        if e.stat(follow_symlinks=False).st_uid != euid:
            continue
        d = _open_at(base.fd, e.name)
        if d is None:
            continue
        try:
            if e.name == SET_ASIDE:
                for x in _entries(d):
                    if x.is_dir(follow_symlinks=False) and _PLAIN.fullmatch(x.name):
                        target = _target(own, (SET_ASIDE,))
                        try:
                            os.rename(x.name, x.name, src_dir_fd=d, dst_dir_fd=target)
                            adopted.append(f"{SET_ASIDE}/{x.name}")
                        except OSError:
                            pass
                        finally:
                            os.close(target)
                continue
            if not _legacy(d) or _open_at(own, e.name) is not None:
                continue
            _write_at(d, OWNER, identity + "\n")
        finally:
            os.close(d)
        with contextlib.suppress(OSError):
            os.rename(e.name, e.name, src_dir_fd=base.fd, dst_dir_fd=own)
            adopted.append(e.name)
    with contextlib.suppress(OSError):
        os.rmdir(SET_ASIDE, dir_fd=base.fd)  # only when empty
    return tuple(adopted)


# ---- a launch ---------------------------------------------------------------------------------------


def _own_root(base: Base, identity: str, euid: int) -> tuple[int, str, str]:
    """This daemon's directory in the base (made 0700): (fd, name, path)."""
    name = f"{ROOT_PREFIX}{identity}"
    path = f"{base.path.rstrip('/')}/{name}"
    fd = _dir_at(base.fd, name, path, create=True)
    st = os.fstat(fd)
    if st.st_uid != euid:
        os.close(fd)
        raise Refused(f"{path} is owned by uid {st.st_uid}, not by this daemon's user: left alone")
    if _read_at(fd, OWNER) is None:
        _write_at(fd, OWNER, identity + "\n")
    return fd, name, path


def prepare(
    home: Home,
    fp: str,
    server_env: Mapping[str, str],
    *,
    pin: bool,
    max_bytes: int,
    now_wall: float,
) -> Prepared:
    """Before a launch: set aside what a crashed launch left, prune, pin what the operator left unset,
    and write the launch's marker. A `cache_dir` that is not safe to use (cacheplace.py) or a link
    where a directory goes leaves the caches unpinned with the reason in the view (`refused`). An
    OSError here (a full or read-only disk) is the caller's to record: the launch goes on unpinned."""
    operator = tuple(var for var, _ in CACHE_VARS if server_env.get(var))
    if not pin:
        return Prepared({}, CacheView(dir="", state="unpinned", operator_set=operator))
    try:
        if not _PLAIN.fullmatch(fp):
            raise Refused(f"the fingerprint {fp!r} is not a plain name")
        identity = daemon_identity(home.state_dir)
        with opened(home.cache_dir, home.euid) as base:
            return _prepare_in(base, home, identity, fp, operator, max_bytes, now_wall)
    except Refused as why:
        return Prepared({}, CacheView(dir="", state="unpinned", operator_set=operator, refused=str(why)))


def _prepare_in(
    base: Base, home: Home, identity: str, fp: str, operator: tuple[str, ...], max_bytes: int, now_wall: float
) -> Prepared:
    own, own_name, own_path = _own_root(base, identity, home.euid)
    try:
        adopted = _adopt(base, own, identity, home.euid) if home.adopt_legacy and base.place == "own" else ()
        dpath = f"{own_path}/{fp}"
        d = _dir_at(own, fp, dpath, create=True)
        try:
            if not _owned(d, identity):
                _write_at(d, OWNER, identity + "\n")  # this daemon's directory holds only its own
            aside_at: str | None = None
            crashed = _read_marker(d)
            if crashed is not None:
                aside_at, _moved = _set_aside(own, own_path, d, fp, crashed, now_wall)
                aside_at = aside_at or None
            pruned, left = _prune(own, own_path, fp, max_bytes, identity)
            before = _content_size(d)
            env: dict[str, str] = {}
            for var, sub in CACHE_VARS:
                if var in operator:
                    continue
                os.close(_dir_at(d, sub, f"{dpath}/{sub}", create=True))
                env[var] = f"{dpath}/{sub}"
            _write_at(d, MARKER, json.dumps({"launched_wall": now_wall, "pid": os.getpid()}))
        finally:
            os.close(d)
        others, others_bytes = _others(base, own_name)
    finally:
        os.close(own)
    state: CacheState = "set_aside" if crashed is not None and aside_at else ("hit" if before > 0 else "miss")
    view = CacheView(
        dir=dpath,
        state=state,
        bytes_before=before,
        pinned=tuple(env),
        operator_set=operator,
        set_aside=aside_at,
        others=others,
        others_bytes=others_bytes,
    )
    return Prepared(env, view, pruned, tuple(left), adopted)


def _fp_dir(home: Home, base: Base, fp: str) -> int | None:
    """This daemon's directory of `fp` in the base, opened without following a link; None if absent."""
    identity = daemon_identity(home.state_dir)
    own = _open_at(base.fd, f"{ROOT_PREFIX}{identity}")
    if own is None:
        return None
    try:
        d = _open_at(own, fp) if _PLAIN.fullmatch(fp) else None
    finally:
        os.close(own)
    if d is not None and not _owned(d, identity):
        os.close(d)
        return None
    return d


def existing(home: Home, fp: str) -> str | None:
    """The path of this daemon's cache of `fp` when it has one (an adopted server's), else None."""
    try:
        with opened(home.cache_dir, home.euid, create=False) as base:
            d = _fp_dir(home, base, fp)
            if d is None:
                return None
            os.close(d)
            return f"{base.path.rstrip('/')}/{ROOT_PREFIX}{daemon_identity(home.state_dir)}/{fp}"
    except (Refused, OSError):
        return None


def mark_ready(view: CacheView, home: Home) -> CacheView:
    """The server is ready: its launch completed every compile it needed; clear the marker, note the use."""
    if not view.dir:
        return view
    try:
        with opened(home.cache_dir, home.euid, create=False) as base:
            d = _fp_dir(home, base, Path(view.dir).name)
            if d is None:
                return view
            try:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(MARKER, dir_fd=d)
                _write_at(d, USED, str(time.time()))
                return view.model_copy(update={"bytes_after": _content_size(d)})
            finally:
                os.close(d)
    except Refused:
        return view
