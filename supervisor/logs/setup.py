"""Logging configured once, at the entry point: a console format for a person on a terminal, JSON
lines for machines, and journald's conventions under systemd.

structlog renders the daemon's own events; the standard library's loggers (uvicorn, httpx, asyncio)
are routed through the same renderer so journald sees one format.

Under systemd (`JOURNAL_STREAM` names the very stream stderr is, sd-daemon(3)) each line starts
with its syslog priority, `<3>` error, `<4>` warning, `<6>` info, `<7>` debug, which journald strips
and records as PRIORITY, so `journalctl -u sglang-supervisor -p warning` shows warnings and worse.
The line itself is the console format without a timestamp (journald stamps each entry), or JSON
when `--log-json` asks for it.
"""

from __future__ import annotations

import io
import logging
import os
import sys
from collections.abc import Mapping
from typing import Any, TextIO

import structlog

_SHARED: list[structlog.types.Processor] = [
    structlog.contextvars.merge_contextvars,
    structlog.stdlib.add_log_level,
    structlog.stdlib.add_logger_name,
    structlog.processors.TimeStamper(fmt="iso", utc=True),
]

# sd-daemon(3): the kernel's syslog levels.
PRIORITY = {
    logging.CRITICAL: 2,
    logging.ERROR: 3,
    logging.WARNING: 4,
    logging.INFO: 6,
    logging.DEBUG: 7,
}


def priority(levelno: int) -> int:
    """The syslog priority of a logging level (a custom level takes the next one up)."""
    for level in sorted(PRIORITY, reverse=True):
        if levelno >= level:
            return PRIORITY[level]
    return 7


def journal_stream(out: TextIO, env: Mapping[str, str]) -> bool:
    """True when `out` is the journald stream systemd gave us (`JOURNAL_STREAM=<dev>:<inode>`).

    The variable alone is not enough: a child of a service inherits it with a redirected stderr.
    """
    value = env.get("JOURNAL_STREAM", "")
    if not value:
        return False
    try:
        st = os.fstat(out.fileno())
    except (OSError, ValueError, AttributeError, io.UnsupportedOperation):
        return False
    return f"{st.st_dev}:{st.st_ino}" == value


class JournalFormatter(structlog.stdlib.ProcessorFormatter):
    """Each line of a record (a traceback has many) carries the record's `<priority>` prefix."""

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        prefix = f"<{priority(record.levelno)}>"
        return "\n".join(prefix + line for line in text.splitlines() or [""])


def _drop_timestamp(_logger: Any, _name: str, event_dict: Any) -> Any:
    event_dict.pop("timestamp", None)  # journald stamps each entry itself
    return event_dict


def configure(
    *,
    json: bool | None = None,
    level: str = "INFO",
    stream: TextIO | None = None,
    env: Mapping[str, str] | None = None,
) -> str:
    """Configure logging; returns the format chosen: "console", "json", "journal" or "journal+json"."""
    out = stream if stream is not None else sys.stderr
    journal = journal_stream(out, os.environ if env is None else env)
    as_json = (not journal and not out.isatty()) if json is None else json
    renderer: structlog.types.Processor = (
        structlog.processors.JSONRenderer() if as_json else structlog.dev.ConsoleRenderer(colors=False)
    )
    structlog.configure(
        processors=[
            *_SHARED,
            structlog.processors.format_exc_info,
            structlog.stdlib.ProcessorFormatter.wrap_for_formatter,
        ],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=True,
    )
    final: list[structlog.types.Processor] = [structlog.stdlib.ProcessorFormatter.remove_processors_meta]
    if journal and not as_json:
        final.append(_drop_timestamp)
    final.append(renderer)
    cls = JournalFormatter if journal else structlog.stdlib.ProcessorFormatter
    formatter = cls(foreign_pre_chain=_SHARED, processors=final)
    handler = logging.StreamHandler(out)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        lg = logging.getLogger(name)
        lg.handlers[:] = []
        lg.propagate = True
    # httpx logs every request at INFO: the health probe would flood journald.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    logging.getLogger("httpcore").setLevel(logging.WARNING)
    if journal:
        return "journal" + ("+json" if as_json else "")
    return "json" if as_json else "console"
