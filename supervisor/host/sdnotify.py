"""The systemd notify protocol (sd_notify), spoken directly over ``$NOTIFY_SOCKET``.

A message is one datagram of ``KEY=value`` lines sent to an AF_UNIX socket named by the environment:
a filesystem path, or an abstract name written with a leading ``@``. No libsystemd is needed.

When the daemon does not run under systemd (``NOTIFY_SOCKET`` unset) every call is a no-op. When the
socket is gone or full, a send returns False and logs once; it never raises and never blocks, because
it runs on the event loop thread between a probe and an API request.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Mapping

import structlog

log = structlog.get_logger(__name__)

# Variables systemd sets for the main process only. The server child must not inherit them: with
# NotifyAccess=main systemd ignores (and logs) its messages, and a child that spoke the protocol
# could otherwise feed the daemon's watchdog.
NOTIFY_ENV_KEYS: tuple[str, ...] = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")


def _socket_address(raw: str) -> str | None:
    """The sendto() address for a NOTIFY_SOCKET value, or None when it is not one we can speak to."""
    if raw.startswith("/"):
        return raw
    if raw.startswith("@") and len(raw) > 1:
        return "\0" + raw[1:]  # Linux abstract namespace
    return None  # e.g. systemd's vsock: addresses, which a supervised host daemon never gets


def _watchdog_usec(environ: Mapping[str, str], pid: int) -> int | None:
    """WATCHDOG_USEC when it is meant for this process, as sd_watchdog_enabled() decides."""
    raw_usec = environ.get("WATCHDOG_USEC")
    if raw_usec is None:
        return None
    try:
        usec = int(raw_usec)
    except ValueError:
        return None
    if usec <= 0:
        return None
    raw_pid = environ.get("WATCHDOG_PID")
    if raw_pid is not None:
        try:
            if int(raw_pid) != pid:
                return None  # inherited from a parent that is the one being watched
        except ValueError:
            return None
    return usec


class Notifier:
    """Sends state notifications to the service manager; every method returns whether it was sent."""

    def __init__(
        self,
        address: str | None,
        watchdog_usec: int | None = None,
        *,
        monotonic_ns: Callable[[], int] = time.monotonic_ns,
    ) -> None:
        """``address`` is the raw NOTIFY_SOCKET value (``/path`` or ``@abstract``), None to disable.

        ``monotonic_ns`` must read CLOCK_MONOTONIC (systemd compares MONOTONIC_USEC against it).
        """
        self._address = _socket_address(address) if address else None
        self._watchdog_usec = watchdog_usec
        self._monotonic_ns = monotonic_ns
        self._failing = False  # log a failure once, then again only after a send has worked
        if address and self._address is None:
            log.warning("sd_notify_unsupported_socket", notify_socket=address)

    @classmethod
    def from_env(cls, environ: Mapping[str, str], *, pid: int | None = None) -> Notifier:
        """Build from ``NOTIFY_SOCKET``, ``WATCHDOG_USEC`` and ``WATCHDOG_PID`` (``pid`` defaults to ours)."""
        return cls(
            environ.get("NOTIFY_SOCKET") or None,
            _watchdog_usec(environ, os.getpid() if pid is None else pid),
        )

    @property
    def enabled(self) -> bool:
        """True when there is a socket to speak to (we run under a notify-type service)."""
        return self._address is not None

    @property
    def watchdog_interval_s(self) -> float | None:
        """How often to send WATCHDOG=1: half of WATCHDOG_USEC, as systemd recommends; None if unwatched."""
        if self._watchdog_usec is None:
            return None
        return self._watchdog_usec / 2 / 1_000_000

    def send(self, **fields: str | int) -> bool:
        """Send one datagram of ``KEY=value`` lines, e.g. ``send(READY=1, STATUS="loading")``."""
        if self._address is None or not fields:
            return False
        payload = "".join(_line(key, value) + "\n" for key, value in fields.items())
        try:
            # A socket per message, as sd_notify does: nothing to close, nothing a child inherits.
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
                sock.setblocking(False)  # a full receiver queue fails with EAGAIN instead of blocking
                sock.sendto(payload.encode(), self._address)
        except OSError as exc:
            # Socket path gone (systemd restarted, test ended), receiver queue full (EAGAIN),
            # ENOBUFS, ECONNREFUSED: the notification is lost, which is what sd_notify does too.
            if not self._failing:
                self._failing = True
                log.warning("sd_notify_failed", error=str(exc), fields=sorted(fields))
            return False
        if self._failing:
            self._failing = False
            log.info("sd_notify_recovered")
        return True

    def ready(self) -> bool:
        """The daemon's loop and API run (not: the model server is ready; that is the API's business)."""
        return self.send(READY=1)

    def status(self, text: str) -> bool:
        """Free-form one-line status shown by ``systemctl status``."""
        return self.send(STATUS=text)

    def watchdog(self) -> bool:
        """Keep-alive ping; pace it with WatchdogPacer so it only goes out while the loop cycles."""
        return self.send(WATCHDOG=1)

    def stopping(self) -> bool:
        """Shutdown has begun (the server is being stopped before the daemon exits)."""
        return self.send(STOPPING=1)

    def reloading(self) -> bool:
        """A reload (SIGHUP) has begun; send ready() when it is over, whether or not it succeeded."""
        return self.send(RELOADING=1, MONOTONIC_USEC=self._monotonic_ns() // 1000)


def _line(key: str, value: str | int) -> str:
    if not key or "=" in key or "\n" in key:
        raise ValueError(f"not a notify field name: {key!r}")
    text = ("1" if value else "0") if isinstance(value, bool) else str(value)
    # A newline in the value would start a new KEY=value pair inside the datagram.
    return key + "=" + text.replace("\r", " ").replace("\n", " ")


class WatchdogPacer:
    """Decides when the supervisor loop sends WATCHDOG=1; pure, time comes from the caller.

    The loop asks ``due(now)`` once per cycle and calls ``mark(now)`` after sending, so pings stop as
    soon as the loop stops cycling and systemd restarts a daemon stuck in a blocking call. The loop
    must cycle more often than ``interval_s``; the first cycle is always due. With ``interval_s``
    None (no watchdog configured) nothing is ever due.
    """

    def __init__(self, interval_s: float | None) -> None:
        if interval_s is not None and interval_s <= 0:
            raise ValueError(f"watchdog interval must be positive, got {interval_s}")
        self._interval_s = interval_s
        self._last: float | None = None

    @property
    def interval_s(self) -> float | None:
        return self._interval_s

    def due(self, now: float) -> bool:
        if self._interval_s is None:
            return False
        return self._last is None or now - self._last >= self._interval_s

    def mark(self, now: float) -> None:
        self._last = now
