"""The shipped unit file: systemd accepts it, and it keeps what the daemon relies on."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from supervisor.config.settings import RestartSettings, Settings

UNIT = Path(__file__).resolve().parents[2] / "systemd" / "sglang-supervisor.service"
ENV_FILE = UNIT.with_name("sglang-supervisor.env")

Unit = dict[str, dict[str, list[str]]]


def parse_unit(text: str) -> Unit:
    """Sections -> key -> every assignment in order, as systemd's ini dialect reads them.

    Comments start with # or ;, a trailing backslash continues a line, and an empty assignment
    resets the list (as it does for list-valued settings in systemd).
    """
    unit: Unit = {}
    section: dict[str, list[str]] | None = None
    logical: list[str] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not logical and (not line or line[0] in "#;"):
            continue
        if line.endswith("\\"):
            logical.append(line[:-1].rstrip() + " ")
            continue
        line = "".join(logical) + line
        logical = []
        if line.startswith("[") and line.endswith("]"):
            section = unit.setdefault(line[1:-1], {})
            continue
        assert section is not None, f"assignment before any section: {line!r}"
        key, sep, value = line.partition("=")
        assert sep, f"not an assignment: {line!r}"
        values = section.setdefault(key.strip(), [])
        if value.strip():
            values.append(value.strip())
        else:
            values.clear()
    return unit


def test_parser_reads_systemd_ini() -> None:
    unit = parse_unit("# c\n[A]\nK=1\n; c\nK=2 \\\n  3\n[B]\nL=x\nL=\nL=y\n")
    assert unit == {"A": {"K": ["1", "2 3"]}, "B": {"L": ["y"]}}


@pytest.fixture(scope="module")
def unit() -> Unit:
    return parse_unit(UNIT.read_text())


def one(unit: Unit, section: str, key: str) -> str:
    values = unit.get(section, {}).get(key, [])
    assert len(values) == 1, f"[{section}] {key}= should be set once, found {values}"
    return values[0]


def seconds(value: str) -> float:
    match = re.fullmatch(r"(\d+(?:\.\d+)?)\s*(s|sec|min|m)?", value)
    assert match, f"not a simple time span: {value!r}"
    return float(match[1]) * (60 if match[2] in ("min", "m") else 1)


@pytest.mark.parametrize(
    ("section", "key", "expected"),
    [
        ("Service", "Type", "notify"),
        ("Service", "NotifyAccess", "main"),
        ("Service", "WatchdogSec", "30"),
        ("Service", "Restart", "on-failure"),
        ("Service", "RestartSec", "5"),
        ("Service", "KillMode", "process"),
        ("Service", "RestartForceExitStatus", "75"),
        ("Service", "SuccessExitStatus", "75"),
        ("Service", "RestartPreventExitStatus", "3"),
        ("Service", "ExecReload", "/bin/kill -HUP $MAINPID"),
        ("Service", "StateDirectory", "sglang-supervisor"),
        ("Service", "UMask", "0027"),
        ("Service", "EnvironmentFile", "-/etc/sglang-supervisor/env"),
        ("Service", "LimitMEMLOCK", "infinity"),
        ("Service", "TasksMax", "infinity"),
        ("Install", "WantedBy", "multi-user.target"),
    ],
)
def test_required_setting(unit: Unit, section: str, key: str, expected: str) -> None:
    assert one(unit, section, key) == expected


def test_no_logs_directory_that_nothing_uses(unit: Unit) -> None:
    # The daemon logs to the journal and the server's output to state_dir/logs.
    assert "LogsDirectory" not in unit["Service"] and "LogsDirectoryMode" not in unit["Service"]


def test_start_limits_are_in_the_unit_section(unit: Unit) -> None:
    # In [Service] these names are obsolete aliases; they belong to [Unit].
    assert seconds(one(unit, "Unit", "StartLimitIntervalSec")) > 0
    assert int(one(unit, "Unit", "StartLimitBurst")) > 0
    assert "StartLimitIntervalSec" not in unit["Service"]


def test_handoffs_do_not_spend_the_crash_loop_budget(unit: Unit) -> None:
    # A handoff re-executes the daemon in place (tests/integration/test_early_signals.py keeps the pid):
    # systemd counts a start only when the main process exits, which a handoff no longer does. The
    # budget stays small for real crash loops, and a refused second daemon (exit 3) is not retried.
    from supervisor.common.exitcodes import EXIT_HANDOFF, EXIT_LOCKED

    assert int(one(unit, "Unit", "StartLimitBurst")) <= 10
    assert one(unit, "Service", "RestartPreventExitStatus") == str(EXIT_LOCKED)
    assert one(unit, "Service", "RestartForceExitStatus") == str(EXIT_HANDOFF)  # only when the re-exec fails


def test_exec_start_runs_the_daemon_with_the_etc_config(unit: Unit) -> None:
    argv = one(unit, "Service", "ExecStart").split()
    assert argv == [
        "/opt/sglang-supervisor/bin/sglang-supervisor",
        "run",
        "--config",
        "/etc/sglang-supervisor/config.toml",
    ]


def test_stop_timeout_outlasts_the_daemons_own_stop(unit: Unit) -> None:
    # systemd must not SIGKILL the tree while the daemon is still stopping and verifying it.
    defaults = RestartSettings()
    assert seconds(one(unit, "Service", "TimeoutStopSec")) > defaults.stop_grace_s + defaults.release_timeout_s


def test_watchdog_leaves_room_for_a_poll_cycle(unit: Unit) -> None:
    # Pings go out at half of WatchdogSec from a loop that polls every poll_interval_s.
    watchdog_s = seconds(one(unit, "Service", "WatchdogSec"))
    assert Settings().watchdog.poll_interval_s < watchdog_s / 2


def test_state_directory_is_the_default_state_dir(unit: Unit) -> None:
    assert Settings().paths.state_dir == "/var/lib/" + one(unit, "Service", "StateDirectory")


def test_the_kernel_caches_default_to_the_units_persistent_state_directory(unit: Unit) -> None:
    """Issue 36: the compiled kernels outlive a restart and a reboot. `[paths] cache_dir` defaults inside
    the state directory, which the unit keeps under /var/lib (StateDirectory=, persistent), writable
    under ProtectSystem=full, and not a private /tmp (PrivateTmp is absent, tested above)."""
    s = Settings()
    state = Path("/var/lib") / one(unit, "Service", "StateDirectory")
    assert s.cache_dir == state / "cache" and s.cache_dir.is_relative_to(state)
    assert not any(s.cache_dir.is_relative_to(p) for p in (Path("/tmp"), Path("/run"), Path("/dev/shm")))
    assert one(unit, "Service", "ProtectSystem") == "full"  # /usr, /boot, /etc read-only: /var/lib stays writable
    assert "ReadOnlyPaths" not in unit["Service"] and "InaccessiblePaths" not in unit["Service"]
    assert "[paths] cache_dir" in UNIT.read_text()  # the unit's comments tell the operator where they live


def test_ptrace_is_granted_and_bounded(unit: Unit) -> None:
    ambient = " ".join(unit["Service"]["AmbientCapabilities"]).split()
    bounding = " ".join(unit["Service"]["CapabilityBoundingSet"]).split()
    assert ambient == ["CAP_SYS_PTRACE"]
    assert not any(cap.startswith("~") for cap in bounding), "an inverted set would be hard to audit"
    assert {"CAP_SYS_PTRACE", "CAP_KILL"} <= set(bounding)
    assert set(ambient) <= set(bounding), "ambient capabilities must be in the bounding set"


def test_open_file_limit_is_raised(unit: Unit) -> None:
    assert int(one(unit, "Service", "LimitNOFILE")) >= 65536


@pytest.mark.parametrize(
    ("key", "why"),
    [
        ("PrivateDevices", "hides /dev/nvidia*"),
        ("MemoryDenyWriteExecute", "breaks CUDA, Triton and PyTorch JIT"),
        ("ProtectClock", "implies DeviceAllow=char-rtc, which turns on the allow-list and hides the GPUs"),
        ("DeviceAllow", "a device allow-list hides the GPUs unless it names them; left to the operator"),
        ("DevicePolicy", "same"),
        ("ProtectHome", "model and JIT cache paths live under /home and /root"),
        ("PrivateTmp", "torch.compile caches in /tmp would be lost on every restart"),
        ("User", "GPU servers run as root by default; README.md shows the non-root drop-in"),
        ("ProtectControlGroups", "mounts /sys/fs/cgroup read-only: no cgroup per launch (Delegate=yes instead)"),
    ],
)
def test_forbidden_setting_is_absent(unit: Unit, key: str, why: str) -> None:
    assert key not in unit["Service"], f"{key}= must not be set: {why}"


def test_a_syscall_filter_if_any_keeps_ptrace(unit: Unit) -> None:
    filters = " ".join(unit["Service"].get("SystemCallFilter", [])).split()
    if filters:
        assert "@debug" in filters or "ptrace" in filters


def test_the_cgroup_subtree_is_delegated_to_the_daemon(unit: Unit) -> None:
    """The containment the README claims (a cgroup per launch below the daemon's) needs the
    service's subtree writable and the daemon's: Delegate=yes, and no ProtectControlGroups=."""
    assert one(unit, "Service", "Delegate") == "yes"
    assert "ProtectControlGroups" not in unit["Service"]
    # systemd kills only the daemon: the delegated launch cgroups (the server) outlive its exit.
    assert one(unit, "Service", "KillMode") == "process"


def _cgroup2_mount() -> str | None:
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        if right.split(" ", 1)[0] == "cgroup2":
            return left.split()[4]
    return None


FIND = "from supervisor.process.cgroup import CgroupRoot; r, why = CgroupRoot.find(); print(r is not None, why)"


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None, reason="needs root and unshare(1)")
def test_protect_control_groups_would_defeat_the_launch_cgroups() -> None:
    """What ProtectControlGroups=yes does to the service (the cgroup2 mount read-only in its mount
    namespace), done with unshare: the daemon's own check finds no cgroup it may create, where the
    same check without it finds one. The unit under a real systemd (PID 1 of a podman container)
    is tests/release/systemd_smoke.sh's, outside the suite: CI has no container runtime."""
    mount = _cgroup2_mount()
    if mount is None:
        pytest.skip("no cgroup2 mount here")
    writable = subprocess.run([sys.executable, "-c", FIND], capture_output=True, text=True, timeout=60, check=True)
    if not writable.stdout.startswith("True"):
        pytest.skip(f"the cgroup tree is not writable here even without ProtectControlGroups: {writable.stdout}")
    python = shlex.quote(sys.executable)
    script = f"mount -o remount,bind,ro {shlex.quote(mount)} && exec {python} -c {shlex.quote(FIND)}"
    protected = subprocess.run(["unshare", "-m", "sh", "-c", script], capture_output=True, text=True, timeout=60)
    if protected.returncode != 0:
        pytest.skip(f"cannot make a read-only cgroup mount here: {protected.stderr.strip()}")
    ok, _, why = protected.stdout.strip().partition(" ")
    assert ok == "False" and "Read-only file system" in why, protected.stdout


def test_hardening_is_on(unit: Unit) -> None:
    assert one(unit, "Service", "NoNewPrivileges") == "yes"
    assert one(unit, "Service", "ProtectSystem") == "full"


def test_env_file_only_assigns_or_comments() -> None:
    for number, line in enumerate(ENV_FILE.read_text().splitlines(), 1):
        if line.strip() and not line.lstrip().startswith("#"):
            assert re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=\S*", line), f"{ENV_FILE.name}:{number}: {line!r}"


def test_env_file_sets_no_secret() -> None:
    for line in ENV_FILE.read_text().splitlines():
        if not line.lstrip().startswith("#") and "=" in line:
            key, _, value = line.partition("=")
            if "TOKEN" in key and not key.endswith("_FILE"):
                assert not value, f"the example must not carry a secret: {key}"


SYSTEMD_ANALYZE = shutil.which("systemd-analyze")


@pytest.mark.skipif(SYSTEMD_ANALYZE is None, reason="systemd-analyze not installed (apt-get install systemd)")
def test_systemd_analyze_verify_accepts_the_unit(tmp_path: Path) -> None:
    assert SYSTEMD_ANALYZE is not None
    # verify refuses an ExecStart binary that does not exist; the daemon is not installed here.
    stub = tmp_path / "sglang-supervisor"
    stub.write_text("#!/bin/sh\nexit 0\n")
    stub.chmod(0o755)
    text = UNIT.read_text()
    exec_start = "ExecStart=/opt/sglang-supervisor/bin/sglang-supervisor "
    assert text.count(exec_start) == 1
    unit_path = tmp_path / UNIT.name
    unit_path.write_text(text.replace(exec_start, f"ExecStart={stub} "))

    result = subprocess.run(
        [SYSTEMD_ANALYZE, "verify", "--man=no", str(unit_path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )

    output = result.stdout + result.stderr
    ours = [line for line in output.splitlines() if UNIT.name in line]
    assert ours == [], "systemd-analyze complains about the unit:\n" + "\n".join(ours)
    assert result.returncode == 0, output


TEMPLATE = UNIT.with_name("sglang-supervisor@.service")
# What the templated unit changes, and nothing else: per-instance config, environment and state.
INSTANCE_KEYS = {
    ("Unit", "Description"): ["SGLang inference server supervisor (%i)"],
    ("Service", "ExecStart"): [
        "/opt/sglang-supervisor/bin/sglang-supervisor run --config /etc/sglang-supervisor/%i.toml"
    ],
    ("Service", "EnvironmentFile"): ["-/etc/sglang-supervisor/env", "-/etc/sglang-supervisor/%i.env"],
    ("Service", "StateDirectory"): ["sglang-supervisor/%i"],
}


def test_the_template_is_the_unit_with_per_instance_config_env_and_state(unit: Unit) -> None:
    template = parse_unit(TEMPLATE.read_text())
    for (section, key), expected in INSTANCE_KEYS.items():
        assert template[section][key] == expected, (section, key)
    strip = lambda u: {s: {k: v for k, v in kv.items() if (s, k) not in INSTANCE_KEYS} for s, kv in u.items()}  # noqa: E731
    assert strip(template) == strip(unit), "the template drifted from sglang-supervisor.service"


@pytest.mark.skipif(SYSTEMD_ANALYZE is None, reason="systemd-analyze not installed (apt-get install systemd)")
def test_systemd_analyze_verify_accepts_an_instance_of_the_template(tmp_path: Path) -> None:
    assert SYSTEMD_ANALYZE is not None
    stub = tmp_path / "sglang-supervisor"
    stub.write_text("#!/bin/sh\nexit 0\n")
    stub.chmod(0o755)
    text = TEMPLATE.read_text().replace("ExecStart=/opt/sglang-supervisor/bin/sglang-supervisor ", f"ExecStart={stub} ")
    unit_path = tmp_path / TEMPLATE.name
    unit_path.write_text(text)
    instance = tmp_path / "sglang-supervisor@tp4a.service"
    instance.symlink_to(unit_path)
    result = subprocess.run(
        [SYSTEMD_ANALYZE, "verify", "--man=no", str(instance)], capture_output=True, text=True, timeout=60, check=False
    )
    output = result.stdout + result.stderr
    ours = [line for line in output.splitlines() if "sglang-supervisor@" in line]
    assert ours == [], "systemd-analyze complains about the template:\n" + "\n".join(ours)
    assert result.returncode == 0, output
