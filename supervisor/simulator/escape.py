"""A helper that daemonizes out of the server's process group and session, keeping the listening socket.

Run by the main process as `python -m supervisor.simulator.escape FD MAIN_PID` with the listening
socket passed down: it calls setsid(), forks so that it is no longer anyone's child, ignores SIGHUP,
points its standard streams at /dev/null and holds the socket forever. Once the main process is gone
the port stays bound (connections queue, nobody answers) until this process is killed. It keeps
its environment, so a marker variable the supervisor set is still there to find it by.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import time

from supervisor.simulator.onset import write_onset


def main(argv: list[str]) -> int:
    fd, main_pid = int(argv[0]), int(argv[1])
    os.setsid()
    if os.fork() > 0:
        os._exit(0)  # the session leader leaves; the grandchild is reparented away from the server
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    devnull = os.open(os.devnull, os.O_RDWR)
    for std in (0, 1, 2):
        os.dup2(devnull, std)
    held = socket.socket(fileno=fd)
    write_onset(
        os.environ.get("SGLANG_SIM_ONSET_FILE"), "escape_group", "escape_group", main_pid, argv[2:], onset=True
    )
    while held.fileno() >= 0:
        time.sleep(3600)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
