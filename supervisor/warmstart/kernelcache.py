"""Kernel caches that survive relaunches (issue 36).

SGLang and its kernels compile into caches that default under `~/.cache` or `$TMPDIR` (lost with a
private /tmp, a fresh container or another user). Unless the operator set a variable, each is
pinned under `[paths] cache_dir/<fingerprint>/` (one directory per model and rung command line,
shared by its relaunches). FlashInfer's variable is its workspace base (`FLASHINFER_WORKSPACE_BASE`;
FlashInfer appends `.cache/flashinfer`, flashinfer/jit/env.py).

A launch writes a marker (`LAUNCHING`, with the launch's wall time) into its directory and the
ready server clears it. A marker found at the next launch says a launch died before ready (an Xid,
a SIGKILL mid-compile, the daemon's stop of a hung start): whatever that launch wrote (files newer
than its marker) may be half-written, so it is moved to `set-aside/` beside the directory, never
silently reused and never deleted on a guess; what was there before that launch stays (it had been
complete since a launch reached ready). The whole `cache_dir` is pruned to `[caches] max_gb`
before each launch, set-aside copies and the least recently used fingerprints first, never the
fingerprint about to launch.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from supervisor.status.launchviews import CacheState, CacheView

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
SET_ASIDE = "set-aside"
# A file's mtime within this of the marker's time counts as the crashed launch's (clock granularity).
MTIME_SLACK_S = 1.0


@dataclass(frozen=True)
class Prepared:
    env: dict[str, str]  # what the server's environment gets
    view: CacheView
    pruned: tuple[str, ...] = ()


def _size(path: Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                continue
    return total


def _content_size(d: Path) -> int:
    """Bytes of cache entries (the daemon's own marker files left out)."""
    if not d.is_dir():
        return 0
    total = _size(d)
    for own in (MARKER, USED):
        with contextlib.suppress(OSError):
            total -= (d / own).stat().st_size
    return max(0, total)


def _read_marker(d: Path) -> float | None:
    """The launch time a marker records, or None when there is no marker (unreadable: its mtime)."""
    m = d / MARKER
    try:
        doc = json.loads(m.read_text())
        return float(doc["launched_wall"])
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError):
        try:
            return m.stat().st_mtime
        except OSError:
            return None


def set_aside(root: Path, fp: str, since_wall: float, now_wall: float) -> tuple[str, int]:
    """Move what a crashed launch wrote (files modified since `since_wall`) out of the fingerprint's
    directory into `set-aside/<fp>-<time>/`, keeping relative paths. Returns (where, bytes moved)."""
    d = root / fp
    dest = root / SET_ASIDE / f"{fp}-{time.strftime('%Y%m%dT%H%M%S', time.gmtime(now_wall))}"
    moved = 0
    for base, _dirs, files in os.walk(d):
        for name in files:
            src = Path(base) / name
            if src.parent == d and name in (MARKER, USED):
                continue
            try:
                st = src.lstat()
            except OSError:
                continue
            if st.st_mtime < since_wall - MTIME_SLACK_S:
                continue
            target = dest / src.relative_to(d)
            target.parent.mkdir(parents=True, exist_ok=True)
            os.replace(src, target)
            moved += st.st_size
    (d / MARKER).unlink(missing_ok=True)
    return (str(dest) if moved else "", moved)


def prune(root: Path, keep: str, max_bytes: int) -> tuple[str, ...]:
    """Remove set-aside copies (oldest first), then fingerprints by last ready (oldest first), until
    `cache_dir` is within `max_bytes`; never `keep`. Only directories this module made are touched."""
    if not root.is_dir():
        return ()
    aside = root / SET_ASIDE
    candidates: list[tuple[int, float, Path]] = []  # (kind, age key, path): set-aside first
    if aside.is_dir():
        for p in aside.iterdir():
            if p.is_dir():
                candidates.append((0, p.stat().st_mtime, p))
    for p in root.iterdir():
        if not p.is_dir() or p.name in (SET_ASIDE, keep) or not ((p / USED).exists() or (p / MARKER).exists()):
            continue
        used = p / USED if (p / USED).exists() else p / MARKER
        candidates.append((1, used.stat().st_mtime, p))
    total = _size(root)
    removed: list[str] = []
    for _kind, _age, p in sorted(candidates, key=lambda c: (c[0], c[1])):
        if total <= max_bytes:
            break
        size = _size(p)
        shutil.rmtree(p, ignore_errors=True)
        total -= size
        removed.append(str(p))
    return tuple(removed)


def prepare(
    root: Path,
    fp: str,
    server_env: Mapping[str, str],
    *,
    pin: bool,
    max_bytes: int,
    now_wall: float,
) -> Prepared:
    """Before a launch: set aside what a crashed launch left, prune, pin what the operator left unset,
    and write the launch's marker. An OSError here (a full or read-only disk) is the caller's to
    record: the launch goes on with the caches unpinned."""
    operator = tuple(var for var, _ in CACHE_VARS if server_env.get(var))
    if not pin:
        return Prepared({}, CacheView(dir="", state="unpinned", operator_set=operator))
    d = root / fp
    aside_at: str | None = None
    crashed = _read_marker(d)
    if crashed is not None:
        aside_at, _moved = set_aside(root, fp, crashed, now_wall)
        aside_at = aside_at or None
    pruned = prune(root, fp, max_bytes)
    before = _content_size(d)
    env: dict[str, str] = {}
    for var, sub in CACHE_VARS:
        if var in operator:
            continue
        (d / sub).mkdir(parents=True, exist_ok=True, mode=0o700)
        env[var] = str(d / sub)
    d.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = d / (MARKER + ".tmp")
    tmp.write_text(json.dumps({"launched_wall": now_wall, "pid": os.getpid()}))
    os.replace(tmp, d / MARKER)
    state: CacheState = "set_aside" if crashed is not None and aside_at else ("hit" if before > 0 else "miss")
    view = CacheView(
        dir=str(d),
        state=state,
        bytes_before=before,
        pinned=tuple(env),
        operator_set=operator,
        set_aside=aside_at,
    )
    return Prepared(env, view, pruned)


def mark_ready(view: CacheView) -> CacheView:
    """The server is ready: its launch completed every compile it needed; clear the marker, note the use."""
    if not view.dir:
        return view
    d = Path(view.dir)
    (d / MARKER).unlink(missing_ok=True)
    (d / USED).write_text(str(time.time()))
    return view.model_copy(update={"bytes_after": _content_size(d)})
