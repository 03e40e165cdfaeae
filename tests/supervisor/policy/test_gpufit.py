"""What the launch decides about GPU memory held outside the server (supervisor/policy/gpufit.py):
by need, per GPU, under each `[slate] gpu_strangers` policy, with the numbers in the reason."""

from __future__ import annotations

import pytest

from supervisor.config.render import render_rung
from supervisor.config.settings import Rung, settings_from_mapping
from supervisor.engines import VLLM, profile_of
from supervisor.policy.gpufit import (
    GIB,
    GpuRoom,
    Need,
    Stranger,
    decide,
    fit,
    mem_fraction,
    need_of,
    refusals_to_cap,
)

H200 = 141 * GIB
NOTEBOOK = Stranger(123, 0, int(2.5 * GIB), "python nb.py")


def room(index: int, used_gib: float, total: int = H200, ours_gib: float = 0.0) -> GpuRoom:
    return GpuRoom(index, total, int(used_gib * GIB), int(ours_gib * GIB))


@pytest.mark.parametrize(
    ("rooms", "strangers", "need", "policy", "action"),
    [
        # The outside run's case: 2.5 GiB of 141 held, the rung takes 0.3 of it: launch.
        ([room(0, 2.5)], [NOTEBOOK], Need(0.3), "launch", "launch"),
        # A stranger leaving 3 GiB: a rung that needs 42.3 GiB does not fit: wait.
        ([room(0, 138)], [Stranger(123, 0, 138 * GIB, "python nb.py")], Need(0.3), "launch", "wait"),
        # Free exactly the need fits (SGLang takes what it was told it may).
        ([room(0, 141 * 0.7)], [Stranger(5, 0, int(141 * 0.7 * GIB), "x")], Need(0.3), "launch", "launch"),
        # Several GPUs: one short GPU is enough to wait; the others fitting does not help.
        (
            [room(0, 1), room(1, 120), room(2, 0)],
            [Stranger(7, 0, GIB, "a"), Stranger(8, 1, 120 * GIB, "b")],
            Need(0.3),
            "launch",
            "wait",
        ),
        # A stranger on a GPU the server does not use is not in `rooms` but its index is unknown
        # size: never a refusal (the daemon does not refuse on a guess).
        ([room(0, 0)], [Stranger(9, 3, 100 * GIB, "elsewhere")], Need(0.9), "launch", "launch"),
        # Unknown total (the probe read 0): cannot tell, launch.
        ([GpuRoom(0, 0, 0)], [Stranger(9, 0, 100 * GIB, "x")], Need(0.9), "launch", "launch"),
        # Unknown need (no fraction, no floor): launch.
        ([room(0, 100)], [Stranger(9, 0, 100 * GIB, "x")], Need(None), "launch", "launch"),
        # The floor alone: 41 GiB free, 40 wanted: launch; 50 wanted: wait.
        ([room(0, 100)], [Stranger(9, 0, 100 * GIB, "x")], Need(None, 40 * GIB), "launch", "launch"),
        ([room(0, 100)], [Stranger(9, 0, 100 * GIB, "x")], Need(None, 50 * GIB), "launch", "wait"),
        # The floor is a floor: above the fraction it rules, below it the fraction does.
        ([room(0, 100)], [Stranger(9, 0, 100 * GIB, "x")], Need(0.1, 50 * GIB), "launch", "wait"),
        ([room(0, 100)], [Stranger(9, 0, 100 * GIB, "x")], Need(0.5, 10 * GIB), "launch", "wait"),
        # Memory held by this daemon's own processes (being stopped) is free for the launch.
        ([room(0, 130, ours_gib=120)], [Stranger(9, 0, 10 * GIB, "x")], Need(0.9), "launch", "launch"),
        # Memory used that no listed stranger explains (another container's pids) still counts.
        ([room(0, 130)], [Stranger(9, 0, GIB, "x")], Need(0.3), "launch", "wait"),
        # The strict policies: any stranger, however small, however well it fits.
        ([room(0, 0.001)], [Stranger(77, 0, 2**20, "/bin/sleep 300")], Need(0.3), "wait", "wait"),
        ([room(0, 0.001)], [Stranger(77, 0, 2**20, "/bin/sleep 300")], Need(0.3), "refuse", "refuse"),
        # Nothing outside the server: launch under every policy.
        ([room(0, 0)], [], Need(0.9), "wait", "launch"),
        ([room(0, 0)], [], Need(0.9), "refuse", "launch"),
    ],
)
def test_the_launch_is_judged_by_need(rooms, strangers, need, policy, action) -> None:  # type: ignore[no-untyped-def]
    got = decide(rooms, strangers, need, policy)
    assert got.action == action
    assert got.strangers == tuple(strangers)
    if strangers:  # each stranger is named in the reason, but where a refusal leaves its GPU out: it fits
        fits = {g.index for g in got.gpus if g.fits}
        assert all(f"pid {s.pid} ({s.command})" in got.why or (action == "wait" and s.gpu in fits) for s in strangers)
    else:
        assert got.why == ""


def test_a_refusal_gives_the_numbers() -> None:
    stranger = Stranger(123, 0, 138 * GIB, "python nb.py")
    got = decide([room(0, 138)], [stranger], Need(0.3), "launch")
    assert got.action == "wait"
    assert got.why == (
        "the launch does not fit: GPU 0: 3.0 GiB free of 141 GiB, the rung needs 42.3 GiB "
        "(mem-fraction-static 0.3); held by pid 123 (python nb.py) 138.0 GiB"
    )
    (gpu,) = got.gpus
    assert (gpu.free_bytes, gpu.need_bytes, gpu.fits) == (3 * GIB, int(0.3 * H200), False)


def test_only_the_short_gpus_are_in_a_refusal_and_every_gpu_in_the_record() -> None:
    strangers = [Stranger(7, 0, GIB, "a"), Stranger(8, 1, 120 * GIB, "b")]
    got = decide([room(0, 1), room(1, 120)], strangers, Need(0.3), "launch")
    assert "GPU 1: 21.0 GiB free" in got.why and "GPU 0" not in got.why
    assert [(g.index, g.fits) for g in got.gpus] == [(0, True), (1, False)]


def test_fit_per_gpu_sums_the_strangers_on_it() -> None:
    got = fit([room(0, 0)], [Stranger(1, 0, 30 * GIB, "a"), Stranger(2, 0, 40 * GIB, "b")], Need(0.5))
    (gpu,) = got
    assert gpu.free_bytes == H200 - 70 * GIB  # used read 0 (stale), the strangers' own bytes rule
    assert gpu.fits is True and len(gpu.strangers) == 2


@pytest.mark.parametrize(
    ("argv", "fraction"),
    [
        (["python3", "-m", "sglang.launch_server", "--mem-fraction-static", "0.3"], 0.3),
        (["sglang", "--mem-fraction-static=0.85"], 0.85),
        (["sglang", "--mem-fraction-static", "0.3", "--mem-fraction-static", "0.5"], 0.5),  # argparse: last wins
        (["sglang"], None),
        (["sglang", "--mem-fraction-static"], None),
        (["sglang", "--mem-fraction-static", "lots"], None),
        (["sglang", "--mem-fraction-static", "1.5"], None),
        (["sglang", "--mem-fraction-static", "0"], None),
    ],
)
def test_the_fraction_is_read_off_the_command_line(argv: list[str], fraction: float | None) -> None:
    assert mem_fraction(argv) == fraction


def test_the_need_is_the_rungs_rendered_fraction_and_the_floor() -> None:
    """The command line the launch renders (base args, the rung's overrides, its drops)."""
    s = settings_from_mapping(
        {
            "server": {"args": {"model-path": "/m", "mem-fraction-static": 0.8}},
            "fallback": [
                {"name": "lean", "args": {"mem-fraction-static": 0.3}},
                {"name": "auto", "drop": ["mem-fraction-static"]},
            ],
            "slate": {"gpu_need_gib": 20},
        }
    )
    needs = [need_of(render_rung(s.server, r).argv, s.slate.gpu_need_gib) for r in s.ladder]
    assert [n.fraction for n in needs] == [0.8, 0.3, None]
    assert [n.bytes_on(H200) for n in needs] == [int(0.8 * H200), int(0.3 * H200), 20 * GIB]
    assert needs[2].bytes_on(0) == 20 * GIB and Need(0.5).bytes_on(0) is None
    assert need_of(render_rung(s.server, Rung(name="x")).argv, None).describe() == "mem-fraction-static 0.8"


@pytest.mark.parametrize(
    ("initial", "cap", "n"),
    [(5.0, 300.0, 7), (0.5, 1.0, 2), (1.0, 1.0, 1), (0.0, 300.0, 1), (2.0, 1.0, 1), (1.0, 1024.0, 11)],
)
def test_a_refusal_streak_is_told_when_the_backoff_reaches_its_cap(initial: float, cap: float, n: int) -> None:
    assert refusals_to_cap(initial, cap) == n
    if n > 1:  # the refusal before it still grows the backoff, this one is at the cap
        assert initial * 2 ** (n - 2) < cap <= initial * 2 ** (n - 1)


def test_the_policy_key_is_validated() -> None:
    from supervisor.common.configerror import ConfigError

    assert settings_from_mapping({}).slate.gpu_strangers == "launch"
    with pytest.raises(ConfigError, match=r"slate\.gpu_strangers: Input should be 'launch', 'wait' or 'refuse'"):
        settings_from_mapping({"slate": {"gpu_strangers": "ignore"}})
    with pytest.raises(ConfigError, match=r"slate\.gpu_need_gib"):
        settings_from_mapping({"slate": {"gpu_need_gib": -1}})


def test_a_vllm_rungs_need_is_its_gpu_memory_utilization_or_vllms_default() -> None:
    """vLLM refuses to start unless its --gpu-memory-utilization (0.9 unset) of the GPU is free."""
    s = settings_from_mapping(
        {
            "server": {"args": {"model-path": "/m", "mem-fraction-static": 0.8}},
            "fallback": [
                {"name": "v", "engine": "vllm", "args": {"model": "/m", "gpu-memory-utilization": 0.5}},
                {"name": "v-default", "engine": "vllm", "args": {"model": "/m"}},
            ],
        }
    )
    needs = [need_of(render_rung(s.server, r).argv, None, profile_of(s.engine_of(r))) for r in s.ladder]
    assert [n.fraction for n in needs] == [0.8, 0.5, 0.9]
    assert [n.describe() for n in needs][1:] == ["gpu-memory-utilization 0.5", "gpu-memory-utilization 0.9"]
    # SGLang's flag on a vLLM rung is not vLLM's need (and vLLM's parser refuses it anyway)
    assert need_of(["--mem-fraction-static", "0.3"], None, VLLM).fraction == 0.9
