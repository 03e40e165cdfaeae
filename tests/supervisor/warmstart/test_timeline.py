"""The launch timeline's milestones from SGLang 0.5.16's own lines, the comparison with the last good
launch, the book on disk and the outage clock."""

from __future__ import annotations

import json
from pathlib import Path

from probes.types import LogLine
from supervisor.policy.learned import LaunchKey, Learned
from supervisor.warmstart.timeline import (
    BookEntry,
    GoodLaunch,
    LaunchBook,
    Milestones,
    OutageClock,
    compare,
    milestone_of,
    views,
)

# Lines as real SGLang 0.5.16 printed them on the H200 (docs/REAL_SGLANG.md).
REAL = [
    (40.0, "[2026-11-30 10:00:40 TP0] Load weight begin. avail mem=139.10 GB"),
    (40.2, "[2026-11-30 10:00:40 TP0] Load weight end. elapsed=0.20 s, type=LlamaForCausalLM, avail mem=139.0 GB"),
    (40.5, "[2026-11-30 10:00:40 TP0] Load weight begin. avail mem=139.0 GB"),
    (41.0, "[2026-11-30 10:00:41 TP0] KV Cache is allocated. dtype: torch.bfloat16, #tokens: 100000"),
    (42.0, "[2026-11-30 10:00:42 TP0] Capture target verify CUDA graph begin. backend=full"),
    (43.0, "Capturing batches (bs=8 avail_mem=20.12 GB):  50%|█████     | 2/4 [00:01<00:01]"),
    (100.0, "INFO:     Uvicorn running on http://127.0.0.1:30000 (Press CTRL+C to quit)"),
    (219.0, "[2026-11-30 10:03:39] The server is fired up and ready to roll!"),
]


def test_milestones_from_real_lines_first_seen_wins() -> None:
    m = Milestones(launched_at=0.0)
    m.feed([LogLine(i + 1, at, "stderr", text) for i, (at, text) in enumerate(REAL)])
    m.mark("ready", 220.0)
    assert m.offsets() == {
        "spawn": 0.0,
        "weights_loading": 40.0,
        "weights_loaded": 40.2,
        "kv_allocated": 41.0,
        "graph_capture": 42.0,
        "warmup": 100.0,
        "ready_line": 219.0,
        "ready": 220.0,
    }
    v = views(m.offsets())
    assert [x.phase_s for x in v][-3:] == [119.0, 1.0, None]
    assert milestone_of("torch._inductor autotune: 12 choices") == "compile"
    assert milestone_of("Decode batch, #running-req: 3") is None


def test_the_comparison_names_a_phase_that_took_far_longer_than_the_last_good_start() -> None:
    now = views({"spawn": 0.0, "warmup": 60.0, "ready_line": 179.0, "ready": 180.0})
    good = views({"spawn": 0.0, "warmup": 58.0, "ready_line": 60.0, "ready": 61.0})
    assert compare(now, good) == ("warmup took 119.0 s, the last good start 2.0 s",)
    assert compare(good, good) == ()


def test_the_book_survives_a_restart_and_a_bad_file_is_an_empty_book(tmp_path: Path) -> None:
    key = LaunchKey("h", "/m", "base", "abc")
    book = LaunchBook(tmp_path / "launches.json")
    book.put(BookEntry(key, Learned(2, {"spawning": 3.5}), GoodLaunch({"spawn": 0.0, "ready": 9.0}, 9.0, 1e9)))
    book.save()
    again = LaunchBook(tmp_path / "launches.json").load()
    e = again.get(key)
    assert e is not None and e.learned.quiet_s == {"spawning": 3.5} and e.last_good is not None
    assert e.last_good.time_to_ready_s == 9.0 and again.load_error is None
    (tmp_path / "launches.json").write_text("{")
    bad = LaunchBook(tmp_path / "launches.json").load()
    assert bad.get(key) is None and bad.load_error is not None
    (tmp_path / "launches.json").write_text(json.dumps({"version": 1, "entries": {"x": {"host": 1}}}))
    assert "malformed" in (LaunchBook(tmp_path / "launches.json").load().load_error or "")


def test_the_outage_clock_adds_its_parts_up_across_two_incidents() -> None:
    o = OutageClock("id", "startup_stall", began_at=100.0, detection_s=30.0)
    o.close_step(103.0, "stop_release")  # evidence 3 s
    o.close_step(104.0, "backoff")  # stop and release 1 s
    o.close_step(106.0, "relaunch")  # backoff 2 s
    o.again(150.0)  # the relaunch stalled too: 44 s of relaunch
    o.close_step(151.0, "stop_release")
    o.close_step(151.5, "backoff")
    o.close_step(151.5, "relaunch")
    o.close_step(161.5, "relaunch")  # ready
    assert o.parts == {"detection": 30.0, "evidence": 4.0, "stop_release": 1.5, "backoff": 2.0, "relaunch": 54.0}
    assert o.daemon_s == 7.5 and o.total_s == 91.5


def test_an_outage_caused_by_a_gpu_fault_counts_its_detection_from_the_xid() -> None:
    """The H100's Xid (2026-12-06): the daemon read the Xid 2.9 s before the rank it killed died and
    was judged `rank_died`, a verdict with no quiet window; detection counts from the Xid."""
    o = OutageClock("id", "rank_died", began_at=100.0, detection_s=0.0)
    o.began_before(2.9)
    assert o.parts["detection"] == 2.9
    o.began_before(1.0)  # never shorter than what was already known
    assert o.parts["detection"] == 2.9
    o.close_step(101.0, "stop_release")
    o.close_step(102.0, "relaunch")
    o.again(110.0)  # a later incident of the same outage: its fault does not move the outage's start
    o.began_before(50.0)
    assert o.parts["detection"] == 2.9 and o.total_s == 12.9
