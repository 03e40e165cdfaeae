"""Logging is configured once at the entry point: the daemon's events and uvicorn's lines come out alike."""

from __future__ import annotations

import io
import json
import logging

import structlog

from supervisor import logsetup


def test_json_lines_for_structlog_and_stdlib_loggers() -> None:
    out = io.StringIO()
    try:
        logsetup.configure(json=True, stream=out)
        structlog.get_logger("supervisor").info("server_ready", rung="base", pid=123)
        logging.getLogger("uvicorn.error").warning("Uvicorn running on %s", "http://127.0.0.1:8900")
        logging.getLogger("httpx").info("HTTP Request: GET /health")  # quietened: would flood
        lines = [json.loads(x) for x in out.getvalue().splitlines()]
        assert lines[0]["event"] == "server_ready" and lines[0]["rung"] == "base" and lines[0]["level"] == "info"
        assert "timestamp" in lines[0]
        assert lines[1]["event"] == "Uvicorn running on http://127.0.0.1:8900" and lines[1]["logger"] == "uvicorn.error"
        assert len(lines) == 2
    finally:
        structlog.reset_defaults()
        logging.getLogger().handlers[:] = []


def test_console_renderer_for_a_person() -> None:
    out = io.StringIO()
    try:
        logsetup.configure(json=False, stream=out)
        structlog.get_logger("supervisor").warning("incident", cause="startup_stall")
        text = out.getvalue()
        assert "incident" in text and "cause=startup_stall" in text and not text.lstrip().startswith("{")
    finally:
        structlog.reset_defaults()
        logging.getLogger().handlers[:] = []
