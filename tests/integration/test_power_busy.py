"""Busy hangs without GPM (issue 35), through the running daemon on the simulator: a GPU whose NVML
gives power but no GPM (an A100, an L40S, a MIG slice) spins in a kernel that never ends after the
weights load; the power rule calls the stall at the start-up window, and the self-check says which
signal each GPU has."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration


def fake_gpu(tmp_path: Path, **dev: object) -> Path:
    path = tmp_path / "nvml.json"
    path.write_text(json.dumps({"devices": [{"util": 0, "mem_used": 1 << 30, **dev}]}))
    return path


async def test_a_spin_without_gpm_is_judged_by_power(daemon, sim, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    nvml = fake_gpu(tmp_path, power_w=75.0, power_limit_w=700.0)  # no "gpm": this GPU has none
    s = sim(
        "gpu_sleep_after_load",
        watchdog={"startup_stall_s": 4.0, "cpu_only_stall_s": 120.0},
        diagnostics={"py_spy": False},  # no looks either: power alone must tell the spin
        gpu=nvml,
    )
    r = await daemon(s)
    snap = await r.wait_for(lambda x: x.last_incident is not None, 60, "the power rule's stall")
    inc = snap.last_incident
    assert inc is not None and inc.cause == "startup_stall", inc
    assert "power: GPU 0 util 100 % at 94 W, 3% of the way from idle 75 W to its 700 W limit" in inc.detail, inc.detail
    check = next(c for c in snap.selfcheck if c.name == "busy-signal")
    assert check.ok and "GPU 0: power (75 W now, limit 700 W, idle learned at util 0)" in check.detail, check


async def test_the_self_check_says_py_spy_only_without_power(daemon, sim, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    s = sim("ok", gpu=fake_gpu(tmp_path))  # neither GPM nor a power reading
    r = await daemon(s)
    snap = await r.wait_for(lambda x: any(c.name == "busy-signal" for c in x.selfcheck), 30, "the self-check")
    check = next(c for c in snap.selfcheck if c.name == "busy-signal")
    assert not check.ok and "GPU 0: py-spy looks only" in check.detail, check
