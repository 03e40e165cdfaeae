"""The shipped units under a real systemd, PID 1 of this machine's own namespaces (issue 52).

`make systemd` (tests/systemd_real/run.sh) boots systemd 252 in a minimal Debian root file system and
runs this module, which reaches it through nsenter the way an operator's shell would: the wheel and
the units installed as systemd/README.md says, then systemctl, journalctl and the CLI. The server is
the simulator, a real child process tree. Every other pytest run deselects these tests (the
`real_systemd` marker, tests/conftest.py): they need the machine run.sh boots.

Each test starts from a stopped service, an empty state directory, no drop-in and the module's
config (the `service` fixture), so they do not depend on their order.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import freeport
import pytest

pytestmark = [pytest.mark.real_systemd, pytest.mark.timeout(300)]

PID1 = os.environ.get("SGLANG_SUPERVISOR_SYSTEMD_PID1", "")
SHARE = "/mnt/share"  # run.sh's share directory inside the machine: dist/ (the wheel), wheels/, systemd/
README = Path(__file__).resolve().parents[2] / "systemd" / "README.md"
UNIT = "sglang-supervisor"
ETC = "/etc/sglang-supervisor"
STATE = "/var/lib/sglang-supervisor"
CLI = "sglang-supervisor"  # on the PATH, as step 1 of the README's install puts it
# The environment of an operator's root shell in the machine; none of pytest's.
ENV = ("PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root", "LANG=C.UTF-8",
       "SYSTEMD_PAGER=", "SYSTEMD_COLORS=0", "TERM=dumb")  # fmt: skip
CAP_SYS_PTRACE = 19

T = TypeVar("T")


def inside(script: str, *, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run a bash script as root in the machine (its mount, pid and cgroup namespaces and its root)."""
    if not PID1:
        pytest.fail("no machine to test: run `make systemd` (tests/systemd_real/run.sh), which boots it")
    argv = ["nsenter", "-t", PID1, "-m", "-p", "-C", "-r", "-w", "--", "/usr/bin/env", "-i", *ENV]
    proc = subprocess.run(
        [*argv, "/bin/bash", "-euo", "pipefail", "-c", script], capture_output=True, text=True, timeout=timeout
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"in the machine, exit {proc.returncode}:\n$ {script}\n{proc.stdout}{proc.stderr}")
    return proc


def show(unit: str, *props: str) -> dict[str, str]:
    out = inside(f"systemctl show {unit} " + " ".join(f"-p {p}" for p in props)).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def status_text(unit: str = UNIT) -> dict[str, str]:
    """The daemon's STATUS= line as systemd holds it: {'state': 'ready', 'rung': 'base', 'pid': '165'}."""
    return dict(kv.split("=", 1) for kv in show(unit, "StatusText")["StatusText"].split() if "=" in kv)


# The journal's position when the running test began (the `service` fixture): journal() reads after it.
_since: list[str] = []


def journal_cursor() -> str:
    last = inside("journalctl -n 1 --show-cursor -o cat").stdout.strip().splitlines()[-1]
    assert last.startswith("-- cursor: "), last
    return last.removeprefix("-- cursor: ")


def journal(*args: str) -> str:
    """This test's journal entries (journalctl ARGS; "" where none match)."""
    # --cursor, not --after-cursor: journalctl 252 with --after-cursor and -p matches nothing.
    after = [f"--cursor={_since[-1]}"] if _since else []
    cmd = ["journalctl", "--no-pager", *after, *args]
    return inside(" ".join(shlex.quote(a) for a in cmd), check=False).stdout.removesuffix("-- No entries --\n")


def journal_json(*args: str) -> list[dict[str, str]]:
    return [json.loads(line) for line in journal("-o", "json", *args).splitlines() if line.startswith("{")]


def cli_status(config: str = f"{ETC}/config.toml") -> dict[str, object]:
    out = inside(f"{CLI} status --json --config {config}", check=False).stdout
    answer: dict[str, object] = json.loads(out)
    return answer


def wait_for(what: str, probe: Callable[[], T | None], timeout: float = 90.0, unit: str = UNIT) -> T:
    """Poll until `probe` returns something truthy; fail naming `what`, with the unit's journal."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            tail = inside(f"journalctl --no-pager -u {unit} -n 60", check=False).stdout
            raise AssertionError(f"not within {timeout:.0f} s: {what}\n--- journal of {unit}:\n{tail}")
        time.sleep(0.5)


def ready_pid(unit: str = UNIT) -> int | None:
    """The server's pid once the daemon says state=ready (its STATUS= line), else None."""
    st = status_text(unit)
    return int(st["pid"]) if st.get("state") == "ready" and st.get("pid", "-").isdigit() else None


def main_pid(unit: str = UNIT) -> int:
    return int(show(unit, "MainPID")["MainPID"])


def proc_status(pid: int) -> dict[str, str]:
    out = inside(f"cat /proc/{pid}/status").stdout
    return {k: v.strip() for k, _, v in (line.partition(":") for line in out.splitlines())}


def cgroup_of(pid: int) -> str:
    """The process's cgroup v2 path as the machine sees it (its cgroup namespace's root is /)."""
    out = inside(f"cat /proc/{pid}/cgroup").stdout
    return next(line[3:] for line in out.splitlines() if line.startswith("0::"))


def alive(pid: int) -> bool:
    return inside(f"test -d /proc/{pid} && ! grep -q '^State:.*Z' /proc/{pid}/status", check=False).returncode == 0


def readme_block(marker: str) -> str:
    """The one ```sh block of systemd/README.md that contains `marker`."""
    blocks = re.findall(r"^```sh\n(.*?)^```", README.read_text(), re.M | re.S)
    found = [b for b in blocks if marker in b]
    assert len(found) == 1, f"one ```sh block of systemd/README.md should contain {marker!r}"
    return found[0]


def readme_ini(marker: str) -> str:
    blocks = re.findall(r"^```ini\n(.*?)^```", README.read_text(), re.M | re.S)
    found = [b for b in blocks if marker in b]
    assert len(found) == 1, f"one ```ini block of systemd/README.md should contain {marker!r}"
    return found[0]


def put(path: str, text: str) -> None:
    """Write a file in the machine (in place: an existing file keeps its owner and mode)."""
    inside(f"cat > {path} <<'__EOF__'\n{text}__EOF__\n")


@dataclass(frozen=True)
class Ports:
    server: int
    api: int


def config(ports: Ports, *, state_dir: str = STATE, extra: str = "", serving_stall_s: float = 60.0) -> str:
    """The README's "Edit config.toml" step for this machine: the simulator as the server, the
    token's place and the state directory as the README has them; quick start-up windows."""
    return f"""[server]
command = ["/opt/sglang-supervisor/bin/python", "-m", "supervisor.simulator"]
host = "127.0.0.1"
port = {ports.server}

[server.env]
SGLANG_SIM_PACE = "0.2"

[server.args]
model-path = "/models/sim"
tp-size = 2
enable-metrics = true

[watchdog]
poll_interval_s = 1.0
serving_stall_s = {serving_stall_s}

[restart]
stop_grace_s = 10.0
release_timeout_s = 20.0

[api]
host = "127.0.0.1"
port = {ports.api}
token_file = "{ETC}/token"

[paths]
state_dir = "{state_dir}"
{extra}"""


def free_ports() -> Ports:
    # The machine shares the host's network namespace: a port free here is free there.
    return Ports(freeport.free_port(), freeport.free_port())


@pytest.fixture(scope="module")
def ports() -> Ports:
    return free_ports()


@pytest.fixture(scope="module")
def installed(ports: Ports) -> Iterator[Ports]:
    """systemd/README.md's "Install", run as written in the machine. Only what points outside it
    changes: the checkout is the wheel run.sh built from it, pip takes the dependencies from the
    wheels run.sh fetched (PIP_NO_INDEX), and the optional gdb line is left out (no package lists).
    The one step done by hand, editing config.toml, writes `config()`."""
    wheel = inside(f"ls {SHARE}/dist/*.whl").stdout.split()[0]
    step1 = readme_block("# 1. The daemon")
    assert "/path/to/sglang-supervisor" in step1 and "apt-get install -y gdb" in step1
    step1 = step1.replace("/path/to/sglang-supervisor", wheel).replace("apt-get install -y gdb", "")
    inside(f"export PIP_NO_INDEX=1 PIP_FIND_LINKS={SHARE}/wheels\n{step1}", timeout=300)
    inside(f"cd {SHARE}\n{readme_block('# 2. Configuration')}")
    put(f"{ETC}/config.toml", config(ports))
    started = inside(f"cd {SHARE}\n{readme_block('systemctl enable --now sglang-supervisor' + chr(10))}")
    assert "config OK" in started.stdout + started.stderr
    wait_for("the installed service ready", ready_pid)
    yield ports
    inside(f"systemctl disable --now {UNIT}", check=False)


@pytest.fixture
def service(installed: Ports) -> Iterator[Ports]:
    """A stopped service with no drop-in, an empty state directory and the module's config."""
    reset(installed)
    _since[:] = [journal_cursor()]
    yield installed
    reset(installed)
    _since.clear()


def reset(ports: Ports) -> None:
    inside(
        "systemctl stop 'sglang-supervisor*' || true\n"
        "systemctl kill --kill-whom=all --signal=SIGKILL 'sglang-supervisor*' 2>/dev/null || true\n"
        f"rm -rf /etc/systemd/system/{UNIT}.service.d {STATE}\n"
        "systemctl daemon-reload\nsystemctl reset-failed\n"
    )
    put(f"{ETC}/config.toml", config(ports))


def start_ready(unit: str = UNIT) -> int:
    inside(f"systemctl start {unit}")
    return wait_for(f"{unit} state=ready", lambda: ready_pid(unit), unit=unit)


# ---- the contract --------------------------------------------------------------------------------


def test_start_returns_once_the_daemon_is_ready_and_status_shows_its_line(service: Ports) -> None:
    """Type=notify: `systemctl start` returns once the daemon sent READY=1, which it does when its loop
    and API run (not when the model is loaded); `systemctl status` shows its STATUS= line."""
    inside(f"systemctl start {UNIT}")
    # No retry: READY=1 came after the API listened, so it answers the moment start returns.
    livez = inside(f"curl -sS --max-time 10 http://127.0.0.1:{service.api}/livez", check=False)
    assert livez.returncode == 0 and '"ok":true' in livez.stdout, livez.stdout + livez.stderr
    unit = show(UNIT, "ActiveState", "SubState", "Type", "NotifyAccess", "MainPID")
    assert (unit["ActiveState"], unit["SubState"]) == ("active", "running"), unit
    assert (unit["Type"], unit["NotifyAccess"]) == ("notify", "main"), unit
    # "Active: active (running)" is the daemon, not the model: starting or ready, the line says which.
    first = wait_for("a STATUS= line", lambda: status_text() or None, timeout=30)
    assert first["state"] in ("starting", "ready") and first["rung"] == "base", first

    pid = wait_for("state=ready", ready_pid)
    text = inside(f"systemctl status {UNIT} --no-pager --lines=0", check=False).stdout
    assert f'Status: "state=ready rung=base pid={pid}"' in text, text
    assert f"Main PID: {unit['MainPID']}" in text, text
    st = cli_status()
    assert (st["state"], st["pid"], st["rung"]) == ("ready", pid, "base"), st
    # The server is the daemon's child in a cgroup of its own below the service's (Delegate=yes).
    assert re.fullmatch(rf"/system\.slice/{UNIT}\.service/sglang-server-[\w-]+", cgroup_of(pid)), cgroup_of(pid)
    assert int(proc_status(pid)["PPid"]) == main_pid()
    contained = journal("-u", UNIT, "-g", "containment")
    assert f"cgroup v2 at /sys/fs/cgroup/unified/system.slice/{UNIT}.service" in contained or (
        f"cgroup v2 at /sys/fs/cgroup/system.slice/{UNIT}.service" in contained
    ), contained


def test_kill_9_of_the_daemon_restarts_it_and_the_server_is_adopted(service: Ports) -> None:
    """KillMode=process and Delegate=yes: systemd restarts the killed daemon (Restart=on-failure) and
    leaves the server alone; the new daemon adopts it: same pid, same cgroup, no relaunch."""
    pid = start_ready()
    before = show(UNIT, "MainPID", "NRestarts")
    group = cgroup_of(pid)
    inside(f"kill -9 {before['MainPID']}")
    wait_for(
        "a new daemon, ready",
        lambda: main_pid() not in (0, int(before["MainPID"])) and ready_pid() is not None,
        timeout=120,
    )
    after = show(UNIT, "MainPID", "NRestarts", "ActiveState")
    assert int(after["NRestarts"]) == int(before["NRestarts"]) + 1, after
    assert ready_pid() == pid and alive(pid) and cgroup_of(pid) == group
    st = cli_status()
    assert (st["pid"], st["adopted"], st["restarts"]) == (pid, True, 0), st
    adopted = journal("-u", UNIT, "-o", "cat", "-g", "server_adopted")
    assert f"pid={pid}" in adopted, adopted


def test_the_watchdog_aborts_a_stopped_daemon_and_the_restarted_one_adopts_the_server(service: Ports) -> None:
    """WatchdogSec: a daemon whose loop stops (SIGSTOP) is killed with SIGABRT, its Python stacks go
    to the journal (PYTHONFAULTHANDLER), systemd restarts it and the new daemon adopts the server.
    The unit's 30 s is shortened to 10 s in a drop-in so the test waits less; the daemon reads it
    from WATCHDOG_USEC."""
    inside(f"mkdir -p /etc/systemd/system/{UNIT}.service.d")
    put(f"/etc/systemd/system/{UNIT}.service.d/watchdog.conf", "[Service]\nWatchdogSec=10\n")
    inside("systemctl daemon-reload")
    pid = start_ready()
    before = show(UNIT, "MainPID", "NRestarts", "WatchdogUSec")
    assert before["WatchdogUSec"] == "10s", before
    time.sleep(12)  # longer than WatchdogSec while running: the loop feeds it, nothing happens
    assert show(UNIT, "MainPID")["MainPID"] == before["MainPID"], journal("-u", UNIT, "-n", "30")
    inside(f"kill -STOP {before['MainPID']}")
    wait_for(
        "the watchdog's restart, ready",
        lambda: main_pid() not in (0, int(before["MainPID"])) and ready_pid() is not None,
        timeout=120,
    )
    after = show(UNIT, "NRestarts")
    assert int(after["NRestarts"]) == int(before["NRestarts"]) + 1, after
    log = journal("-u", UNIT)
    assert "Watchdog timeout (limit 10s)!" in log, log[-3000:]
    assert f"Killing process {before['MainPID']} (sglang-supervis) with signal SIGABRT" in log, log[-3000:]
    assert "Fatal Python error: Aborted" in log and "Current thread" in log, log[-3000:]
    assert "Failed with result 'watchdog'" in log
    assert ready_pid() == pid and alive(pid)
    st = cli_status()
    assert (st["pid"], st["adopted"], st["restarts"]) == (pid, True, 0), st


def test_reload_applies_a_good_config_and_refuses_a_bad_one(service: Ports) -> None:
    """`systemctl reload` (SIGHUP; the daemon sends RELOADING=1 then READY=1): a good file is applied
    without touching the server; a bad one is refused at error priority and the service keeps running.
    systemd 252 ends the reload job when `kill -HUP` exits, so `systemctl reload` returns before the
    daemon has read the file: the journal has the answer, and `sglang-supervisor reload` waits for it."""
    pid = start_ready()
    daemon = main_pid()
    moved = Ports(service.server, freeport.free_port())  # a new [api] port: the daemon rebinds its API
    put(f"{ETC}/config.toml", config(moved, serving_stall_s=75.0))
    inside(f"systemctl reload {UNIT}")
    wait_for("config_reloaded in the journal", lambda: "config_reloaded" in journal("-u", UNIT, "-g", "config_reload"))

    def livez(port: int) -> subprocess.CompletedProcess[str]:
        return inside(f"curl -sS -m 5 -o /dev/null -w '%{{http_code}}' http://127.0.0.1:{port}/livez", check=False)

    wait_for("the API on its new port", lambda: livez(moved.api).stdout == "200")
    assert livez(service.api).returncode != 0, "the old API port still answers"
    log = journal("-u", UNIT, "-o", "cat")
    assert "Reloading sglang-supervisor.service" in log and "Reloaded sglang-supervisor.service" in log, log[-2000:]
    assert show(UNIT, "ActiveState")["ActiveState"] == "active"
    assert (main_pid(), ready_pid()) == (daemon, pid)
    again = inside(f"{CLI} reload")
    assert "reloaded" in again.stdout, again.stdout

    put(f"{ETC}/config.toml", config(moved, serving_stall_s=-5))
    inside(f"systemctl reload {UNIT}")
    refused = wait_for(
        "config_reload_refused at error priority",
        lambda: journal("-u", UNIT, "-p", "err", "-o", "cat", "-g", "config_reload_refused"),
    )
    assert "serving_stall_s" in refused, refused
    assert show(UNIT, "ActiveState", "SubState") == {"ActiveState": "active", "SubState": "running"}
    assert (main_pid(), ready_pid()) == (daemon, pid)
    cli = inside(f"{CLI} reload", check=False)
    said = cli.stdout + cli.stderr
    assert cli.returncode != 0 and "serving_stall_s" in said, (cli.returncode, said)
    assert cli_status()["state"] == "ready"
    assert (main_pid(), ready_pid()) == (daemon, pid)


def test_stop_stops_the_server_then_the_daemon_and_leaves_nothing(service: Ports) -> None:
    """`systemctl stop`: SIGTERM to the daemon alone, which stops the server its own way, verifies the
    port is free and exits 0; nothing of the unit is left in its cgroup, not even the log keeper."""
    pid = start_ready()
    daemon = main_pid()
    tree = inside(f"cat /sys/fs/cgroup/unified/system.slice/{UNIT}.service/cgroup.procs 2>/dev/null || "
                  f"cat /sys/fs/cgroup/system.slice/{UNIT}.service/cgroup.procs").stdout.split()  # fmt: skip
    assert str(daemon) in tree
    inside(f"systemctl stop {UNIT}", timeout=180)
    unit = show(UNIT, "ActiveState", "Result", "ExecMainStatus", "ControlGroup")
    assert unit == {"ActiveState": "inactive", "Result": "success", "ExecMainStatus": "0", "ControlGroup": ""}, unit
    assert not alive(pid) and not alive(daemon)
    gone = inside(
        f"ls -d /sys/fs/cgroup/*/system.slice/{UNIT}.service /sys/fs/cgroup/system.slice/{UNIT}.service 2>/dev/null",
        check=False,
    )
    assert gone.stdout.strip() == "", f"the unit's cgroups are still there:\n{gone.stdout}"
    leftover = inside("ps -eo pid=,args= | grep -E 'supervisor\\.(simulator|logs\\.keeper)|sglang::' | grep -v grep",
                      check=False).stdout  # fmt: skip
    assert leftover.strip() == "", leftover
    log = journal("-u", UNIT, "-o", "cat")
    stopped = log.index("server_stopped")
    record = log[stopped:].splitlines()[0]
    assert "survivors=[]" in record and "port_free=True" in record, record
    assert stopped < log.index("daemon_exit") < log.index("Deactivated successfully"), log[-2000:]


def test_journal_priorities_filter_the_daemon_and_tag_the_server(service: Ports) -> None:
    """The daemon's lines carry their syslog priority, so `journalctl -p warning` shows its warnings and
    errors and none of its info lines; with [logs] journal = true the server's own output is in the
    unit's journal tagged SYSLOG_IDENTIFIER=sglang (`journalctl -t sglang`)."""
    put(f"{ETC}/config.toml", config(service, extra="\n[logs]\njournal = true\n"))
    pid = start_ready()
    inside(f"kill -9 {pid}")  # the server dies: an incident (warning), then a relaunch (info)
    wait_for("a relaunched server", lambda: (ready_pid() or pid) != pid, timeout=120)
    put(f"{ETC}/config.toml", "this is not toml [\n")
    inside(f"systemctl reload {UNIT}")  # refused: an error
    wait_for("config_reload_refused", lambda: "config_reload_refused" in journal("-u", UNIT, "-g", "refused"))

    daemon = [e for e in journal_json("-u", UNIT) if e.get("SYSLOG_IDENTIFIER") == UNIT]
    by_priority: dict[str, list[str]] = {}
    for e in daemon:
        by_priority.setdefault(e.get("PRIORITY", "?"), []).append(str(e.get("MESSAGE", "")))
    info = " ".join(by_priority.get("6", []))
    assert "server_launched" in info and "state_changed" in info, sorted(by_priority)
    warned = [e for e in journal_json("-u", UNIT, "-p", "warning") if e.get("SYSLOG_IDENTIFIER") == UNIT]
    messages = " ".join(str(e.get("MESSAGE", "")) for e in warned)
    assert "incident" in messages and "config_reload_refused" in messages, messages
    assert {e["PRIORITY"] for e in warned} <= {"3", "4"}, warned
    for line in ("server_launched", "state_changed", "selfcheck", "api_listening"):
        assert line not in messages, f"{line} (info) passed -p warning: {messages}"
    assert any("config_reload_refused" in str(e["MESSAGE"]) and e["PRIORITY"] == "3" for e in warned)
    assert any(" incident " in f" {e['MESSAGE']} " and e["PRIORITY"] == "4" for e in warned), messages

    server = journal_json("-t", "sglang")
    assert server, "no entry tagged SYSLOG_IDENTIFIER=sglang"
    assert all(e.get("_SYSTEMD_UNIT") == f"{UNIT}.service" for e in server), {e.get("_SYSTEMD_UNIT") for e in server}
    assert any("ready to roll" in str(e.get("MESSAGE")) for e in server), [e.get("MESSAGE") for e in server][-10:]
    both = journal("-u", UNIT, "-o", "cat")  # daemon and server together
    assert "ready to roll" in both and "server_launched" in both


def test_two_instances_of_the_template_each_with_its_own_state_and_ports(service: Ports) -> None:
    """sglang-supervisor@.service as the README's "Several servers on one host" installs it: two
    daemons, each ready with its own server, state directory and API; stopping one leaves the other
    serving."""
    a, b = free_ports(), free_ports()
    sudo = 'sudo() { "$@"; }\n'  # the block's sudo: these shells are root already
    before, sep, after = readme_block("sglang-supervisor@tp4a sglang-supervisor@tp4b").partition(
        "sudo systemctl daemon-reload\n"
    )
    assert sep, before
    inside(f"{sudo}cd {SHARE}\n{before}")
    # The edit the README's comments ask for: each its own [server] port, [api] port and state_dir.
    for name, p in (("tp4a", a), ("tp4b", b)):
        put(f"{ETC}/{name}.toml", config(p, state_dir=f"{STATE}/{name}"))
    body, _, last = after.rstrip("\n").rpartition("\n")
    assert last.startswith(f"{CLI} status --config {ETC}/tp4b.toml"), last
    inside(f"{sudo}{sep}{body}")
    pa = wait_for("tp4a ready", lambda: ready_pid(f"{UNIT}@tp4a"), unit=f"{UNIT}@tp4a")
    pb = wait_for("tp4b ready", lambda: ready_pid(f"{UNIT}@tp4b"), unit=f"{UNIT}@tp4b")
    assert pa != pb
    status = inside(last, check=False)
    assert status.returncode == 0 and re.search(r"^state\s+ready", status.stdout, re.M), status.stdout + status.stderr
    assert re.search(rf"^pid\s+{pb}\b", status.stdout, re.M), status.stdout
    for name, pid in (("tp4a", pa), ("tp4b", pb)):
        assert cgroup_of(pid).startswith(f"/system.slice/system-sglang\\x2dsupervisor.slice/{UNIT}@{name}.service/")
        inside(f"test -s {STATE}/{name}/events.jsonl && test -f {STATE}/{name}/logs/server.log")
        env = inside(f"tr '\\0' '\\n' < /proc/{main_pid(f'{UNIT}@{name}')}/environ").stdout
        assert ("CUDA_VISIBLE_DEVICES=0,1,2,3" if name == "tp4a" else "CUDA_VISIBLE_DEVICES=4,5,6,7") in env
    assert cli_status(f"{ETC}/tp4a.toml")["pid"] == pa

    inside(f"systemctl stop {UNIT}@tp4a", timeout=180)
    assert not alive(pa)
    assert ready_pid(f"{UNIT}@tp4b") == pb and alive(pb)
    health = inside(f"curl -sS --max-time 10 -o /dev/null -w '%{{http_code}}' http://127.0.0.1:{b.server}/health")
    assert health.stdout == "200"
    assert cli_status(f"{ETC}/tp4b.toml")["state"] == "ready"
    inside(f"systemctl disable --now {UNIT}@tp4a {UNIT}@tp4b", timeout=180)


def test_the_dedicated_user_steps_as_written_give_a_working_service(service: Ports) -> None:
    """The README's "Running as a dedicated user", run as written: the account, the group on the config, the
    token's owner, check-config as that user, then the drop-in through `systemctl edit` and a
    restart. The daemon and the server run as `sglang`; the daemon keeps CAP_SYS_PTRACE (ambient),
    the server holds no capability."""
    start_ready()  # as root first, as the README has it
    try:
        as_the_service_user()
    finally:  # the account stays; root owns the config again, as the other tests expect
        inside(f"chown root:root {ETC} {ETC}/config.toml {ETC}/token", check=False)


def as_the_service_user() -> None:
    steps = inside(readme_block("useradd "))
    assert "config OK" in steps.stdout + steps.stderr, steps.stdout + steps.stderr
    put("/root/dropin.conf", readme_ini("User=sglang"))
    # `systemctl edit` wants a terminal (script(1) gives it one) and runs $SYSTEMD_EDITOR on its file.
    inside(f"SYSTEMD_EDITOR='cp /root/dropin.conf' script -qec 'systemctl edit {UNIT}' /dev/null </dev/null")
    dropin = inside(f"cat /etc/systemd/system/{UNIT}.service.d/override.conf").stdout
    assert "User=sglang" in dropin and "Group=sglang" in dropin, dropin
    inside(f"systemctl restart {UNIT}", timeout=180)
    pid = wait_for("ready as sglang", ready_pid, timeout=120)
    uid = inside("id -u sglang").stdout.strip()
    daemon = proc_status(main_pid())
    server = proc_status(pid)
    assert daemon["Uid"].split()[0] == uid and server["Uid"].split()[0] == uid, (daemon["Uid"], server["Uid"])
    assert int(daemon["CapAmb"], 16) & (1 << CAP_SYS_PTRACE), daemon["CapAmb"]
    assert int(server["CapEff"], 16) == 0 and int(server["CapAmb"], 16) == 0, (server["CapEff"], server["CapAmb"])
    owner = inside(f"stat -c '%U %a' {STATE} {STATE}/events.jsonl").stdout.split("\n")
    assert owner[0] == "sglang 750" and owner[1] == "sglang 640", owner
    st = cli_status()
    assert (st["state"], st["pid"]) == ("ready", pid), st
    checks = st.get("selfcheck")
    assert isinstance(checks, list), st
    ptrace = [c for c in checks if c.get("name") == "ptrace"]
    assert ptrace and ptrace[0].get("ok") is True, ptrace
