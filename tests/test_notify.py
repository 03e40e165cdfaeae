from __future__ import annotations

import os
import socket
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from fakeclock import FakeClock
from structlog.testing import capture_logs

from supervisor.host.sdnotify import NOTIFY_ENV_KEYS, Notifier, WatchdogPacer


class Receiver:
    """The service manager's end: a bound AF_UNIX datagram socket."""

    def __init__(self, sock: socket.socket, notify_socket: str) -> None:
        self.sock = sock
        self.notify_socket = notify_socket

    def raw(self) -> str:
        # Unix datagrams are queued by the time sendto() returns, so a non-blocking read suffices.
        return self.sock.recv(4096).decode()

    def message(self) -> dict[str, str]:
        return parse(self.raw())

    def drain(self) -> list[dict[str, str]]:
        messages = []
        while True:
            try:
                messages.append(self.message())
            except BlockingIOError:
                return messages


def parse(datagram: str) -> dict[str, str]:
    assert datagram.endswith("\n")
    return dict(line.split("=", 1) for line in datagram.splitlines())


@pytest.fixture
def path_receiver(tmp_path: Path) -> Iterator[Receiver]:
    path = tmp_path / "notify.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(str(path))
        sock.setblocking(False)
        yield Receiver(sock, str(path))


@pytest.fixture
def abstract_receiver() -> Iterator[Receiver]:
    name = f"sglang-supervisor-test-{uuid.uuid4().hex}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind("\0" + name)
        sock.setblocking(False)
        yield Receiver(sock, "@" + name)


@pytest.fixture(params=["path", "abstract"])
def receiver(request: pytest.FixtureRequest) -> Receiver:
    fixture = "path_receiver" if request.param == "path" else "abstract_receiver"
    got: Receiver = request.getfixturevalue(fixture)
    return got


def test_lifecycle_messages(receiver: Receiver) -> None:
    notifier = Notifier.from_env({"NOTIFY_SOCKET": receiver.notify_socket})
    assert notifier.enabled

    assert notifier.ready()
    assert receiver.message() == {"READY": "1"}
    assert notifier.status("state=ready rung=base pid=123")
    assert receiver.message() == {"STATUS": "state=ready rung=base pid=123"}
    assert notifier.watchdog()
    assert receiver.message() == {"WATCHDOG": "1"}
    assert notifier.stopping()
    assert receiver.message() == {"STOPPING": "1"}
    assert receiver.drain() == []


def test_reloading_carries_monotonic_usec(receiver: Receiver) -> None:
    notifier = Notifier(receiver.notify_socket, monotonic_ns=lambda: 12_345_678_901)
    assert notifier.reloading()
    assert receiver.message() == {"RELOADING": "1", "MONOTONIC_USEC": "12345678"}


def test_reloading_uses_clock_monotonic_by_default(path_receiver: Receiver) -> None:
    before = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
    Notifier(path_receiver.notify_socket).reloading()
    sent = int(path_receiver.message()["MONOTONIC_USEC"])
    assert before <= sent <= time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000


def test_send_is_one_datagram_with_fields_in_order(path_receiver: Receiver) -> None:
    notifier = Notifier(path_receiver.notify_socket)
    assert notifier.send(STATUS="two\nlines", READY=1, ERRNO=0)
    assert path_receiver.raw() == "STATUS=two lines\nREADY=1\nERRNO=0\n"


def test_bool_values_are_sent_as_digits(path_receiver: Receiver) -> None:
    Notifier(path_receiver.notify_socket).send(READY=True)
    assert path_receiver.message() == {"READY": "1"}


def test_bad_field_name_is_a_programming_error(path_receiver: Receiver) -> None:
    with pytest.raises(ValueError, match="field name"):
        Notifier(path_receiver.notify_socket).send(**{"A=B": 1})


def test_unset_notify_socket_is_a_no_op() -> None:
    notifier = Notifier.from_env({})
    assert not notifier.enabled
    assert notifier.watchdog_interval_s is None
    assert not notifier.ready()
    assert not notifier.status("state=ready")
    assert not notifier.watchdog()
    assert not notifier.reloading()
    assert not notifier.stopping()


def test_empty_notify_socket_is_a_no_op() -> None:
    assert not Notifier.from_env({"NOTIFY_SOCKET": ""}).ready()


def test_unsupported_address_is_a_no_op() -> None:
    notifier = Notifier.from_env({"NOTIFY_SOCKET": "vsock:2:1234"})
    assert not notifier.enabled
    assert not notifier.ready()


def test_vanished_socket_does_not_raise(tmp_path: Path) -> None:
    path = tmp_path / "notify.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(str(path))
        notifier = Notifier(str(path))
        assert notifier.ready()
    path.unlink()
    assert not notifier.watchdog()
    assert not notifier.stopping()  # still quiet on the second failure


def test_a_failing_socket_logs_once_until_it_works_again(tmp_path: Path) -> None:
    path = tmp_path / "notify.sock"
    notifier = Notifier(str(path))
    with capture_logs() as logs:
        for _ in range(5):
            notifier.watchdog()
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.bind(str(path))
            notifier.watchdog()
            notifier.watchdog()
    assert [entry["event"] for entry in logs] == ["sd_notify_failed", "sd_notify_recovered"]


def test_socket_never_bound_does_not_raise(tmp_path: Path) -> None:
    assert not Notifier(str(tmp_path / "missing.sock")).ready()
    assert not Notifier("@sglang-supervisor-test-nobody-" + uuid.uuid4().hex).ready()


def test_full_receiver_queue_does_not_block(path_receiver: Receiver) -> None:
    notifier = Notifier(path_receiver.notify_socket)
    # Nobody reads: the kernel queue fills, and sends then fail at once instead of blocking.
    results = [notifier.send(STATUS="x" * 1024) for _ in range(2000)]
    assert results[0]
    assert not results[-1]
    # Draining the queue lets notifications through again.
    path_receiver.drain()
    assert notifier.watchdog()


def test_recovers_after_the_socket_comes_back(tmp_path: Path) -> None:
    path = tmp_path / "notify.sock"
    notifier = Notifier(str(path))
    assert not notifier.ready()
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(str(path))
        assert notifier.ready()
        assert sock.recv(64, socket.MSG_DONTWAIT) == b"READY=1\n"


@pytest.mark.parametrize(
    ("environ", "interval"),
    [
        ({"WATCHDOG_USEC": "30000000"}, 15.0),
        ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": str(os.getpid())}, 15.0),
        ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": str(os.getpid() + 1)}, None),
        ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "nope"}, None),
        ({"WATCHDOG_USEC": "0"}, None),
        ({"WATCHDOG_USEC": "-5"}, None),
        ({"WATCHDOG_USEC": "soon"}, None),
        ({"WATCHDOG_PID": str(os.getpid())}, None),
        ({}, None),
    ],
)
def test_watchdog_interval_is_half_of_watchdog_usec(environ: dict[str, str], interval: float | None) -> None:
    assert Notifier.from_env({"NOTIFY_SOCKET": "/run/x", **environ}).watchdog_interval_s == interval


def test_watchdog_pid_compares_with_injected_pid() -> None:
    environ = {"NOTIFY_SOCKET": "/run/x", "WATCHDOG_USEC": "2000000", "WATCHDOG_PID": "4242"}
    assert Notifier.from_env(environ, pid=4242).watchdog_interval_s == 1.0
    assert Notifier.from_env(environ, pid=4243).watchdog_interval_s is None


def test_child_env_keys_cover_what_systemd_sets() -> None:
    assert set(NOTIFY_ENV_KEYS) == {"NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID"}


def test_pacer_first_cycle_is_due_then_waits_the_interval() -> None:
    clock = FakeClock()
    pacer = WatchdogPacer(15.0)
    assert pacer.due(clock.now)
    pacer.mark(clock.now)
    assert not pacer.due(clock.now)
    clock.advance(14.9)
    assert not pacer.due(clock.now)
    clock.advance(0.1)
    assert pacer.due(clock.now)
    pacer.mark(clock.now)
    clock.advance(1.0)
    assert not pacer.due(clock.now)


def test_pacer_without_watchdog_is_never_due() -> None:
    pacer = WatchdogPacer(None)
    assert pacer.interval_s is None
    assert not pacer.due(0.0)
    assert not pacer.due(1e9)


@pytest.mark.parametrize("interval", [0.0, -1.0])
def test_pacer_refuses_a_non_positive_interval(interval: float) -> None:
    with pytest.raises(ValueError, match="positive"):
        WatchdogPacer(interval)


def loop_cycles(notifier: Notifier, pacer: WatchdogPacer, clock: FakeClock, cycles: int, poll_s: float) -> None:
    """What the supervisor loop does each cycle, minus observe/decide/act."""
    for _ in range(cycles):
        if pacer.due(clock.monotonic()):
            notifier.watchdog()
            pacer.mark(clock.monotonic())
        clock.advance(poll_s)


def test_watchdog_pings_at_half_watchdog_usec_and_stop_when_the_loop_stalls(
    path_receiver: Receiver,
) -> None:
    environ = {"NOTIFY_SOCKET": path_receiver.notify_socket, "WATCHDOG_USEC": "30000000"}
    notifier = Notifier.from_env(environ)
    assert notifier.watchdog_interval_s == 15.0
    pacer = WatchdogPacer(notifier.watchdog_interval_s)
    clock = FakeClock()

    # 60 s of a loop polling every 1 s: pings at t=0, 15, 30, 45.
    loop_cycles(notifier, pacer, clock, cycles=60, poll_s=1.0)
    assert path_receiver.drain() == [{"WATCHDOG": "1"}] * 4

    # The loop stalls for 40 s (it does not call the pacer): nothing goes out, systemd's 30 s fires.
    clock.advance(40.0)
    assert path_receiver.drain() == []

    # The loop cycles again: the very next cycle is overdue and pings.
    loop_cycles(notifier, pacer, clock, cycles=1, poll_s=1.0)
    assert path_receiver.drain() == [{"WATCHDOG": "1"}]
