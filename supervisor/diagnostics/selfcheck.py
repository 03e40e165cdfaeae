"""At start: will dumps work? Found on day one, not during the first incident."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

from probes.types import GpuObservation
from supervisor.diagnostics.pystack import find_pystack
from supervisor.diagnostics.tools import find_gdb, find_py_spy
from supervisor.status.snapshot import ToolCheck

CAP_SYS_PTRACE = 19
_VERSION_TIMEOUT_S = 5.0


def _version(exe: str) -> str:
    try:
        done = subprocess.run(
            [exe, "--version"], capture_output=True, text=True, timeout=_VERSION_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"version unknown ({err})"
    return version_line(done.stdout or done.stderr)


def version_line(text: str) -> str:
    """The first line that is not a wrapper's chatter (cuda-gdb prints `exec: ...` before its version)."""
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip() and not ln.lstrip().startswith("exec:")]
    return lines[0] if lines else "version unknown"


def _cap_eff(proc_root: Path) -> int | None:
    try:
        for line in (proc_root / "self" / "status").read_text().splitlines():
            if line.startswith("CapEff:"):
                return int(line.split()[1], 16)
    except (OSError, ValueError, IndexError):
        return None
    return None


def _yama_scope(proc_root: Path) -> int | None:
    try:
        return int((proc_root / "sys" / "kernel" / "yama" / "ptrace_scope").read_text().strip())
    except (OSError, ValueError):
        return None  # no Yama: the classic rules (same uid) apply


def ptrace_check(proc_root: Path = Path("/proc"), server_uid: int | None = None) -> ToolCheck:
    """CAP_SYS_PTRACE, or Yama letting a same-uid tool attach to the server (scope 0 or no Yama).

    Scope 1 allows tracing descendants only: py-spy and gdb are siblings of the server (both our
    children), so scope 1 without the capability is refused.
    """
    caps = _cap_eff(proc_root)
    if caps is not None and caps >> CAP_SYS_PTRACE & 1:
        return ToolCheck(name="ptrace", ok=True, detail="CAP_SYS_PTRACE in effect")
    scope = _yama_scope(proc_root)
    uid = os.geteuid()
    same_uid = server_uid is None or server_uid == uid
    fix = "grant CAP_SYS_PTRACE (systemd: AmbientCapabilities=CAP_SYS_PTRACE)"
    if scope in (None, 0):
        where = "no Yama LSM" if scope is None else "yama ptrace_scope=0"
        if same_uid:
            return ToolCheck(name="ptrace", ok=True, detail=f"{where}; tools and server run as uid {uid}")
        return ToolCheck(name="ptrace", ok=False, detail=f"{where} but the server runs as another uid: {fix}")
    if scope == 1:
        return ToolCheck(
            name="ptrace",
            ok=False,
            detail="yama ptrace_scope=1 lets a process trace only its descendants, and the dump tools are "
            f"not ancestors of the server: {fix}, or set kernel.yama.ptrace_scope=0",
        )
    return ToolCheck(
        name="ptrace",
        ok=False,
        detail=f"yama ptrace_scope={scope}: {fix}"
        + ("" if scope == 2 else " (scope 3 forbids ptrace entirely until reboot)"),
    )


def self_check(
    py_spy_path: str | None = None, gdb_path: str | None = None, proc_root: Path = Path("/proc")
) -> tuple[ToolCheck, ...]:
    """py-spy, ptrace permission, gdb and cuda-gdb, each ok or not with a reason and the fix."""
    checks: list[ToolCheck] = []
    spy = find_py_spy(py_spy_path)
    if spy:
        checks.append(ToolCheck(name="py-spy", ok=True, detail=f"{_version(spy)} at {spy}"))
    else:
        where = py_spy_path or "PATH or beside the interpreter"
        checks.append(ToolCheck(name="py-spy", ok=False, detail=f"not found ({where}): pip install py-spy"))
    checks.append(ptrace_check(proc_root))
    gdb, kind = find_gdb(gdb_path)
    cuda, _ = find_gdb("cuda-gdb") if kind != "cuda-gdb" else (gdb, kind)
    if gdb and kind == "gdb":
        checks.append(ToolCheck(name="gdb", ok=True, detail=f"{_version(gdb)} at {gdb}"))
    elif gdb:
        checks.append(ToolCheck(name="gdb", ok=True, detail=f"gdb absent; cuda-gdb at {gdb} serves"))
    else:
        where = gdb_path or "PATH"
        checks.append(
            ToolCheck(
                name="gdb", ok=False, detail=f"neither gdb nor cuda-gdb found ({where}): apt install gdb"
            )
        )
    if cuda:
        checks.append(ToolCheck(name="cuda-gdb", ok=True, detail=f"{_version(cuda)} at {cuda}"))
    else:
        checks.append(
            ToolCheck(name="cuda-gdb", ok=False, detail="not found (optional: also names a stuck GPU kernel)")
        )
    stack = find_pystack()
    if stack:
        checks.append(ToolCheck(name="pystack", ok=True, detail=f"at {' '.join(stack)}"))
    else:
        why = "not found (optional: reads a stopped process's stacks, where py-spy cannot): pip install pystack"
        checks.append(ToolCheck(name="pystack", ok=False, detail=why))
    return tuple(checks)


_GPM_OK = re.compile(r"GPU (\d+): ok\b")


def busy_signal_check(gpu: GpuObservation, gpm_ok: bool, gpm_detail: str, idle_power_w: float | None) -> ToolCheck:
    """Which signal tells a busy GPU's work from a spin, per GPU (issue 35): GPM where it reads; else
    power draw against idle and the power limit where NVML gives both; else py-spy looks alone."""
    if gpu.status != "ok":
        return ToolCheck(
            name="busy-signal", ok=False, detail=f"no NVML ({gpu.reason})", kind="capability", instead="py-spy looks"
        )
    with_gpm = {int(i) for i in _GPM_OK.findall(gpm_detail)} if gpm_ok else set()
    parts: list[str] = []
    for d in gpu.devices:
        if d.index in with_gpm:
            parts.append(f"GPU {d.index}: GPM")
        elif d.power_w is not None and d.power_limit_w is not None:
            idle = f"idle {idle_power_w:g} W as set" if idle_power_w is not None else "idle learned at util 0"
            parts.append(f"GPU {d.index}: power ({d.power_w:.0f} W now, limit {d.power_limit_w:.0f} W, {idle})")
        else:
            parts.append(f"GPU {d.index}: py-spy looks only (no GPM, no power reading or limit)")
    ok = bool(parts) and not any("py-spy looks only" in p for p in parts)
    instead = "" if ok else "py-spy looks where a GPU has neither GPM nor a power reading"
    return ToolCheck(
        name="busy-signal", ok=ok, detail="; ".join(parts)[:400] or "no GPU", kind="capability", instead=instead
    )
