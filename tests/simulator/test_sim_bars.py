"""The progress bars, byte for byte against what tqdm 4.x prints for the same counts and clock."""

from __future__ import annotations

import pytest

from supervisor.simulator.bars import SHARDS_FORMAT, Bar, bar_cells, format_interval, format_meter, format_rate

SHARDS = "Multi-thread loading shards"


@pytest.mark.parametrize(
    ("n", "total", "elapsed", "rate", "desc", "fmt", "expected"),
    [
        (0, 8, 0.0, None, SHARDS, SHARDS_FORMAT, f"{SHARDS}:   0% Completed | 0/8 [00:00<?, ?it/s]"),
        (4, 8, 2.26, 1.77, SHARDS, SHARDS_FORMAT, f"{SHARDS}:  50% Completed | 4/8 [00:02<00:02,  1.77it/s]"),
        (1, 8, 33.0, 1 / 33, SHARDS, SHARDS_FORMAT, f"{SHARDS}:  12% Completed | 1/8 [00:33<03:51, 33.00s/it]"),
        (0, 23, 0.0, None, "", None, "  0%|          | 0/23 [00:00<?, ?it/s]"),
        (
            8,
            23,
            1.6,
            5.1,
            "Capturing batches (bs=96 avail_mem=20.12 GB)",
            None,
            "Capturing batches (bs=96 avail_mem=20.12 GB):  35%|███▍      | 8/23 [00:01<00:02,  5.10it/s]",
        ),
        (
            23,
            23,
            2.0,
            None,
            "Capturing batches (bs=1 avail_mem=19.00 GB)",
            None,
            "Capturing batches (bs=1 avail_mem=19.00 GB): 100%|██████████| 23/23 [00:02<00:00, 11.50it/s]",
        ),
        (3725, 10000, 3725.0, 1.0, "", None, " 37%|███▋      | 3725/10000 [1:02:05<1:44:35,  1.00it/s]"),
    ],
)
def test_format_meter_matches_tqdm(
    n: int, total: int, elapsed: float, rate: float | None, desc: str, fmt: str | None, expected: str
) -> None:
    assert format_meter(n, total, elapsed, rate, desc, fmt) == expected


def test_pieces() -> None:
    assert format_interval(59.9) == "00:59"
    assert format_interval(3600) == "1:00:00"
    assert format_rate(None) == "?it/s"
    assert format_rate(0.5) == " 2.00s/it"
    assert format_rate(12.345) == "12.35it/s"
    assert bar_cells(0.0) == " " * 10
    assert bar_cells(1.0) == "█" * 10
    assert bar_cells(0.35) == "███▌      "


class FakeClock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_shard_bar_sequence_is_tqdms() -> None:
    """SGLang 0.5.16's BAR_FORMAT: each refresh is `\\r<line>` in place; closing repeats it and ends the line."""
    out: list[str] = []
    clock = FakeClock(100.0)
    bar = Bar(3, out.append, desc=SHARDS, bar_format=SHARDS_FORMAT, clock=clock)
    for _ in range(3):
        clock.now += 0.5
        bar.update()
    bar.close()
    assert "".join(out) == (
        f"\r{SHARDS}:   0% Completed | 0/3 [00:00<?, ?it/s]"
        f"\r{SHARDS}:  33% Completed | 1/3 [00:00<00:01,  2.00it/s]"
        f"\r{SHARDS}:  67% Completed | 2/3 [00:01<00:00,  2.00it/s]"
        f"\r{SHARDS}: 100% Completed | 3/3 [00:01<00:00,  2.00it/s]"
        f"\r{SHARDS}: 100% Completed | 3/3 [00:01<00:00,  2.00it/s]\n"
    )


def test_capture_bar_sequence_is_tqdms() -> None:
    """In-place `\\r` refreshes; the shown count lags until mininterval and dynamic miniters allow a refresh."""
    out: list[str] = []
    clock = FakeClock(200.0)
    bar = Bar(4, out.append, clock=clock)
    for i in range(4):
        bar.set_description(f"Capturing batches (bs={8 - 2 * i} avail_mem={20 - 0.1 * i:.2f} GB)")
        clock.now += 0.05 if i < 2 else 0.3
        bar.update()
    bar.close()
    assert "".join(out) == (
        "\r  0%|          | 0/4 [00:00<?, ?it/s]"
        "\rCapturing batches (bs=8 avail_mem=20.00 GB):   0%|          | 0/4 [00:00<?, ?it/s]"
        "\rCapturing batches (bs=6 avail_mem=19.90 GB):   0%|          | 0/4 [00:00<?, ?it/s]"
        "\rCapturing batches (bs=6 avail_mem=19.90 GB):  50%|█████     | 2/4 [00:00<00:00, 20.00it/s]"
        "\rCapturing batches (bs=4 avail_mem=19.80 GB):  50%|█████     | 2/4 [00:00<00:00, 20.00it/s]"
        "\rCapturing batches (bs=2 avail_mem=19.70 GB):  50%|█████     | 2/4 [00:00<00:00, 20.00it/s]"
        "\rCapturing batches (bs=2 avail_mem=19.70 GB): 100%|██████████| 4/4 [00:00<00:00,  5.07it/s]"
        "\rCapturing batches (bs=2 avail_mem=19.70 GB): 100%|██████████| 4/4 [00:00<00:00,  5.71it/s]\n"
    )


def test_slow_shards_print_seconds_per_item() -> None:
    out: list[str] = []
    clock = FakeClock(0.0)
    bar = Bar(8, out.append, desc=SHARDS, bar_format=SHARDS_FORMAT, clock=clock)
    clock.now += 33.0
    bar.update()
    assert out[-1] == f"\r{SHARDS}:  12% Completed | 1/8 [00:33<03:51, 33.00s/it]"
    clock.now += 33.0
    bar.update()  # past tqdm's maxinterval: every slow item still prints
    assert "2/8" in out[-1]
