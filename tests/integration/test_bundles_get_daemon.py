"""`sglang-supervisor bundles get ID` against the running daemon (issue 50): the real CLI, a child
process with the token in its environment, saves a real bundle into a directory it creates (0700,
each file 0600 and byte for byte the daemon's), and a second run writes nothing over it.
tests/supervisor/client/test_bundles_get_hostile.py has the answering sides that lie."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

pytestmark = pytest.mark.integration

TOKEN = "bundles-get-daemon-token-" + "d" * 16
ROOT = Path(__file__).resolve().parents[2]


def cli(cwd: Path, api: str, *words: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SGLANG_SUPERVISOR_TOKEN": TOKEN, "PYTHONPATH": str(ROOT)}
    env.pop("SGLANG_SUPERVISOR_CONFIG", None)
    argv = [sys.executable, "-m", "supervisor", "bundles", "--url", api, "get", *words]
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


async def test_bundles_get_saves_a_real_bundle_into_a_private_directory_it_creates(daemon, sim, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    import asyncio

    s = sim("ok", tp=1)
    r = await daemon(s, {**os.environ, s.api.token_env: TOKEN})
    await r.wait_for(lambda x: x.state == "ready", 60, "ready")
    bearer = {"Authorization": f"Bearer {TOKEN}"}
    async with httpx.AsyncClient(base_url=r.api, timeout=120, headers=bearer) as c:
        body = (await c.post("/diagnose", json={})).json()
    bundle = body["bundle_id"]
    saved = Path(s.paths.state_dir) / "diagnostics" / bundle
    here = tmp_path / "here"
    here.mkdir()
    got = await asyncio.to_thread(cli, here, r.api, bundle)
    assert got.returncode == 0, (got.stdout, got.stderr)
    where = here / bundle
    assert (where.stat().st_mode & 0o777) == 0o700
    files = sorted(p.name for p in saved.iterdir() if p.is_file())
    assert files and sorted(p.name for p in where.iterdir()) == files
    for name in files:
        assert ((where / name).stat().st_mode & 0o777) == 0o600, name
        assert (where / name).read_bytes() == (saved / name).read_bytes(), name
    assert {str(p.relative_to(here)) for p in here.rglob("*")} == {bundle} | {f"{bundle}/{n}" for n in files}
    again = await asyncio.to_thread(cli, here, r.api, bundle)
    assert again.returncode == 1 and "exists; not overwritten" in again.stderr, again.stderr
