"""Logging is configured once at the entry point: the daemon's events and uvicorn's lines come out alike."""

from __future__ import annotations

import io
import json
import logging
import os
import re

import structlog

from supervisor.logs import setup as logsetup


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


def _journal_file(tmp_path):  # type: ignore[no-untyped-def]
    f = open(tmp_path / "journal-stream", "w+")  # noqa: SIM115 - closed by the test
    st = os.fstat(f.fileno())
    return f, {"JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}"}


def test_under_systemd_each_line_carries_its_syslog_priority(tmp_path) -> None:  # type: ignore[no-untyped-def]
    f, env = _journal_file(tmp_path)
    try:
        assert logsetup.configure(stream=f, env=env) == "journal"
        log = structlog.get_logger("supervisor")
        log.info("server_ready", rung="base")
        log.warning("incident", cause="serving_stall")
        logging.getLogger("uvicorn.error").error("boom")
        try:
            raise ValueError("kaput")
        except ValueError:
            log.exception("loop_error")
        f.flush()
        lines = (tmp_path / "journal-stream").read_text().splitlines()
        assert lines[0].startswith("<6>") and "server_ready" in lines[0] and "rung=base" in lines[0]
        assert lines[1].startswith("<4>") and "cause=serving_stall" in lines[1]
        assert lines[2].startswith("<3>") and "boom" in lines[2]
        # A traceback spans lines: every one of them keeps the priority (journald splits on newlines).
        rest = lines[3:]
        assert len(rest) > 3 and all(x.startswith("<3>") for x in rest) and any("ValueError: kaput" in x for x in rest)
        assert not re.search(r"<\d>\d{4}-\d\d-\d\d", "\n".join(lines))  # journald stamps the time itself
    finally:
        f.close()
        structlog.reset_defaults()
        logging.getLogger().handlers[:] = []


def test_json_under_systemd_when_asked_and_no_prefix_for_an_inherited_variable(tmp_path) -> None:  # type: ignore[no-untyped-def]
    f, env = _journal_file(tmp_path)
    other = io.StringIO()
    try:
        assert logsetup.configure(json=True, stream=f, env=env) == "journal+json"
        structlog.get_logger("supervisor").warning("incident", cause="exited")
        f.flush()
        line = (tmp_path / "journal-stream").read_text().splitlines()[0]
        assert line.startswith("<4>{") and json.loads(line[3:])["cause"] == "exited"
        # A child of a service inherits JOURNAL_STREAM with another stderr: not the journal then.
        assert logsetup.configure(stream=other, env=env) == "json"
    finally:
        f.close()
        structlog.reset_defaults()
        logging.getLogger().handlers[:] = []


def test_priorities_follow_sd_daemon() -> None:
    assert [logsetup.priority(x) for x in (10, 20, 30, 40, 50, 25)] == [7, 6, 4, 3, 2, 6]
