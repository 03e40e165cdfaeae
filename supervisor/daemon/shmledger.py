"""Which shared-memory segments this daemon's trees made: the proof the clean slate needs before it
removes one (supervisor.daemon.cleanslate.stale_shm).

While a server runs, the daemon notes the pids of its tree (every observation) and, every
`SCAN_EVERY_S` (backing off to `SCAN_MAX_S` while nothing new is found) or when the tree's pids
change, the files under the shm directory that the tree maps or holds open (/proc/<pid>/maps and fd/
of its own members only). Both go to `state_dir/shm_ours.json`
with the boot they were seen in, so they outlive the daemon (a SIGKILLed daemon's successor still
knows them) and never outlive a reboot (pids restart). Bounded: the newest `KEEP` of each.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Iterable
from pathlib import Path

from supervisor.common.atomicfile import atomic_write
from supervisor.daemon import cleanslate as cs

LEDGER_NAME = "shm_ours.json"
SCAN_EVERY_S = 5.0
# A scan that found nothing new waits twice as long for the next, up to this (issue 51: a GPU
# server's maps run to thousands of lines per process); new pids or a new name bring back
# SCAN_EVERY_S. A segment made meanwhile is recorded at most this late: until then a clean slate keeps
# it, never removes it wrongly.
SCAN_MAX_S = 30.0
KEEP = 4096


def boot_id(proc_root: str = "/proc") -> str:
    try:
        with open(f"{proc_root}/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


def load(state_dir: Path, boot: str) -> cs.OursShm:
    """What the ledger proves ours in this boot; nothing when missing, malformed or of another boot."""
    try:
        doc = json.loads((state_dir / LEDGER_NAME).read_bytes()[: 1 << 20])
    except (OSError, ValueError):
        return cs.OursShm(frozenset(), frozenset())
    if not isinstance(doc, dict) or doc.get("boot") != boot or not boot:
        return cs.OursShm(frozenset(), frozenset())
    pids, names = doc.get("pids"), doc.get("names")
    return cs.OursShm(
        frozenset(p for p in pids if isinstance(p, int) and p > 0) if isinstance(pids, list) else frozenset(),
        frozenset(n for n in names if isinstance(n, str)) if isinstance(names, list) else frozenset(),
    )


def _save(state_dir: Path, boot: str, pids: list[int], names: list[str]) -> None:
    doc = {"boot": boot, "pids": pids[-KEEP:], "names": names[-KEEP:]}
    # Best effort: without it a segment is kept, never removed wrongly. atomic_write leaves no
    # temporary behind on a full disk.
    with contextlib.suppress(OSError):
        atomic_write(state_dir / LEDGER_NAME, (json.dumps(doc) + "\n").encode())


def mapped_by(pids: Iterable[int], shm_dir: Path, proc_root: str = "/proc") -> set[str]:
    """The files directly under `shm_dir` that the processes `pids` map or hold open."""
    return cs.names_in_use(shm_dir, proc_root, pids=pids)


class ShmLedger:
    """The owner's notes; `note` is cheap when nothing changed (a set comparison)."""

    def __init__(self, state_dir: Path, monotonic: Callable[[], float], proc_root: str = "/proc") -> None:
        self.state_dir = state_dir
        self.monotonic = monotonic
        self.proc_root = proc_root
        self.boot = boot_id(proc_root)
        ours = load(state_dir, self.boot)
        self._pids, self._names = sorted(ours.pids), sorted(ours.names)
        self._seen_pids: frozenset[int] = frozenset()
        self._scanned_at: float | None = None
        self._every = SCAN_EVERY_S

    def due(self, pids: Iterable[int]) -> bool:
        now = self.monotonic()
        return frozenset(pids) != self._seen_pids or self._scanned_at is None or now - self._scanned_at >= self._every

    def note(self, pids: Iterable[int], shm_dir: str) -> None:
        """Record the tree's pids and what it maps under `shm_dir` (blocking: call in a thread)."""
        tree = frozenset(p for p in pids if p > 0)
        changed = tree != self._seen_pids
        self._seen_pids, self._scanned_at = tree, self.monotonic()
        new_pids = sorted(tree - set(self._pids))
        new_names = sorted(mapped_by(tree, Path(shm_dir), self.proc_root) - set(self._names)) if shm_dir else []
        quiet = not (changed or new_pids or new_names)
        self._every = min(2 * self._every, SCAN_MAX_S) if quiet else SCAN_EVERY_S
        if new_pids or new_names:
            self._pids += new_pids
            self._names += new_names
            _save(self.state_dir, self.boot, self._pids, self._names)


def sweep(shm_dir: Path, state_dir: Path, proc_root: str = "/proc") -> tuple[list[cs.StaleShm], list[str]]:
    """Remove the segments the ledger proves this daemon's trees made and that are dead now."""
    entries = cs.list_shm(shm_dir)
    if not entries or not os.access(f"{proc_root}/self/maps", os.R_OK):
        return [], []  # nothing to judge, or no way to see who maps it: nothing is removed
    ours = load(state_dir, boot_id(proc_root))
    stale = cs.stale_shm(entries, cs.pid_alive, cs.names_in_use(shm_dir, proc_root), os.getuid(), ours)
    return cs.remove_shm(shm_dir, stale)
