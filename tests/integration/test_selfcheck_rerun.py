"""Issue 38: the self-check runs again on reload (and hourly), so a tool installed after the
daemon started clears without a restart; and what a GPU cannot do is said as such, not FAILED."""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
from pathlib import Path

import httpx
import pytest

from supervisor.cli import build_parser
from supervisor.client.verbs import run_client
from supervisor.config.render import dump_toml

pytestmark = pytest.mark.integration


async def test_a_tool_installed_later_clears_on_reload(daemon, sim, tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    real = shutil.which("py-spy") or str(Path(os.sys.executable).parent / "py-spy")  # type: ignore[attr-defined]
    later = tmp_path / "tools" / "py-spy"
    s = sim("ok", tp=1, diagnostics={"py_spy_path": str(later)})
    config = tmp_path / "config.toml"
    config.write_text(dump_toml(s))
    r = await daemon(s, config_path=config)
    await r.wait_for(lambda x: x.state == "ready", 40, "ready")
    spy = next(c for c in r.snap().selfcheck if c.name == "py-spy")
    assert not spy.ok and str(later) in spy.detail

    later.parent.mkdir()
    later.symlink_to(real)  # installed while the daemon runs
    async with httpx.AsyncClient(timeout=30) as c:
        assert (await c.post(f"{r.api}/reload", json={})).status_code == 200
    snap = await r.wait_for(lambda x: any(c.name == "py-spy" and c.ok for c in x.selfcheck), 30, "py-spy usable")
    spy = next(c for c in snap.selfcheck if c.name == "py-spy")
    assert str(later) in spy.detail

    capsys.readouterr()
    args: argparse.Namespace = build_parser().parse_args(["status", "--url", r.api])
    await asyncio.to_thread(run_client, args, {})
    out = capsys.readouterr().out
    assert "FAILED py-spy" not in out
    assert "FAILED gpm" not in out and "FAILED busy-signal" not in out  # no NVML here: not available, no failure
    assert "busy-signal not available here" in out and "the daemon uses py-spy looks instead" in out
