"""What SGLang 0.5.16's watchdog does before it kills its tree: one py-spy pass of its own process
(`srt/utils/cudacore_pyspy_dump_utils.py: pyspy_dump_schedulers`), `--native` first, then plain,
each logged as one record whose message spans the dump's lines."""

from __future__ import annotations

import os
import subprocess

from supervisor.simulator.loglines import LogWriter


def pyspy_dump_self(log: LogWriter, timeout_s: float = 30.0) -> None:
    pid = os.getpid()
    for attempt, native_flag in enumerate(["--native", ""]):
        cmd = f"py-spy dump {native_flag} --pid {pid}".replace("  ", " ")
        try:
            result = subprocess.run(cmd, shell=True, capture_output=True, text=True, check=True, timeout=timeout_s)
        except subprocess.CalledProcessError as e:
            log.error(f"Pyspy failed ({cmd}). Error: {(e.stderr or '').strip()}")
            if attempt == 1:
                log.error(f"All pyspy dump attempts failed for PID {pid}.")
            continue
        except subprocess.TimeoutExpired:
            log.error(f"Pyspy failed ({cmd}). Error: timed out")
            continue
        log.error(f"Pyspy dump for PID {pid} ({cmd}):\n{result.stdout.rstrip()}")
        return
