from __future__ import annotations

import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from probes.logs import LogParser, clean, parse_decode, parse_progress, split_prefix
from probes.types import DecodeStats, LogLine, Phase

FIXTURES = Path(__file__).parent / "fixtures"


def lines_of(texts: list[str], start: int = 1) -> list[LogLine]:
    return [LogLine(seq=i, at=i * 0.5, stream="stderr", text=t) for i, t in enumerate(texts, start)]


def read_fixture(name: str) -> list[LogLine]:
    """Split as the log reader does: a carriage-return update is a line of its own."""
    raw = (FIXTURES / name).read_text(encoding="utf-8")
    texts = [seg for row in raw.split("\n") for seg in row.split("\r") if seg]
    return lines_of(texts)


def parse(texts: list[str]) -> LogParser:
    parser = LogParser()
    parser.feed(lines_of(texts))
    return parser


# (fixture, marker, nth line containing it, phase after that line, (done, total, unit) or None)
CHECKPOINTS: list[tuple[str, str, int, Phase, tuple[int, int, str] | None]] = [
    ("eagle3_tp8_startup.log", "server_args=", 1, "spawning", None),
    ("eagle3_tp8_startup.log", "Init torch distributed begin", 1, "initializing", None),
    ("eagle3_tp8_startup.log", "Load weight begin", 1, "loading_weights", None),
    ("eagle3_tp8_startup.log", "Load weight begin", 8, "loading_weights", None),
    ("eagle3_tp8_startup.log", "| 0/64 [", 1, "loading_weights", (0, 64, "shards")),
    ("eagle3_tp8_startup.log", "| 32/64 [", 1, "loading_weights", (32, 64, "shards")),
    ("eagle3_tp8_startup.log", "type=DeepseekV3ForCausalLM", 8, "loading_weights", (64, 64, "shards")),
    ("eagle3_tp8_startup.log", "KV Cache is allocated", 1, "allocating_kv", None),
    ("eagle3_tp8_startup.log", "Capture cuda graph begin", 1, "capturing_graphs", None),
    ("eagle3_tp8_startup.log", "| 8/23 [", 1, "capturing_graphs", (8, 23, "batches")),
    ("eagle3_tp8_startup.log", "Capture cuda graph end", 8, "capturing_graphs", (23, 23, "batches")),
    # the draft model, loaded after the target's graphs in this build
    ("eagle3_tp8_startup.log", "Load weight begin", 9, "loading_draft", None),
    ("eagle3_tp8_startup.log", "| 1/1 [", 1, "loading_draft", (1, 1, "shards")),
    ("eagle3_tp8_startup.log", "type=LlamaForCausalLMEagle3", 8, "loading_draft", (1, 1, "shards")),
    ("eagle3_tp8_startup.log", "KV Cache is allocated", 9, "allocating_kv", None),
    ("eagle3_tp8_startup.log", "Capture cuda graph begin", 9, "capturing_graphs", None),
    ("eagle3_tp8_startup.log", "| 20/23 [", 2, "capturing_graphs", (20, 23, "batches")),
    ("eagle3_tp8_startup.log", "max_total_num_tokens", 1, "capturing_graphs", (23, 23, "batches")),
    ("eagle3_tp8_startup.log", "Application startup complete", 1, "warming_up", None),
    ("eagle3_tp8_startup.log", "POST /generate", 1, "warming_up", None),
    ("eagle3_tp8_startup.log", "ready to roll", 1, "serving", None),
    ("crash_oom.log", "Load weight begin", 1, "loading_weights", None),
    ("crash_oom.log", "| 4/8 [", 1, "loading_weights", (4, 8, "shards")),
    ("crash_oom.log", "Memory pool end", 2, "allocating_kv", None),
    ("crash_oom.log", "| 1/23 [", 1, "capturing_graphs", (1, 23, "batches")),
    ("crash_oom.log", "Received sigquit", 1, "capturing_graphs", (1, 23, "batches")),
    ("newer_build_dp.log", "Init torch distributed begin", 1, "initializing", None),
    ("newer_build_dp.log", "| 8/16 [", 1, "loading_weights", (8, 16, "shards")),
    # the draft model, loaded right after the target's weights in this build
    ("newer_build_dp.log", "Load weight begin", 5, "loading_draft", None),
    ("newer_build_dp.log", "type=Qwen3MoeForCausalLMEagle3", 4, "loading_draft", None),
    ("newer_build_dp.log", "KV Cache is allocated", 1, "allocating_kv", None),
    ("newer_build_dp.log", "Capture target decode CUDA graph begin", 1, "capturing_graphs", None),
    ("newer_build_dp.log", "| 6/12 [", 1, "capturing_graphs", (6, 12, "batches")),
    ("newer_build_dp.log", "Capture draft extend CUDA graph end", 4, "capturing_graphs", (12, 12, "batches")),
    ("newer_build_dp.log", "Uvicorn running on", 1, "warming_up", None),
    ("newer_build_dp.log", "Decode batch", 1, "warming_up", None),
]


@pytest.mark.parametrize(("fixture", "marker", "nth", "phase", "progress"), CHECKPOINTS)
def test_fixture_phase_and_progress(
    fixture: str, marker: str, nth: int, phase: Phase, progress: tuple[int, int, str] | None
) -> None:
    lines = read_fixture(fixture)
    hits = [i for i, line in enumerate(lines) if marker in line.text]
    assert len(hits) >= nth, f"{fixture} has {len(hits)} lines with {marker!r}"
    parser = LogParser()
    parser.feed(lines[: hits[nth - 1] + 1])
    obs = parser.observe()
    assert obs.phase == phase
    got = (obs.progress.done, obs.progress.total, obs.progress.unit) if obs.progress else None
    assert got == progress
    assert obs.lines_total == hits[nth - 1] + 1
    assert obs.last_line_at == lines[hits[nth - 1]].at


def test_full_eagle3_startup_ends_serving_with_decode_stats() -> None:
    parser = LogParser()
    parser.feed(read_fixture("eagle3_tp8_startup.log"))
    obs = parser.observe()
    assert obs.phase == "serving"
    assert obs.ready_line_seen
    assert obs.errors == ()
    assert obs.decode_lines_total == 2
    assert obs.last_decode == DecodeStats(
        at=obs.last_line_at or 0.0, running_reqs=5, queue_reqs=1, gen_throughput=210.5, accept_len=2.9
    )


def test_crash_fixture_errors_name_the_exceptions() -> None:
    parser = LogParser()
    parser.feed(read_fixture("crash_oom.log"))
    obs = parser.observe()
    assert not obs.ready_line_seen
    assert obs.errors == (
        "TP0: Exception: Capture cuda graph failed: CUDA out of memory. Tried to allocate 2.00 GiB.",
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
        "capacity of 79.19 GiB of which 1.02 GiB is free.",
        "TP1: NCCL WARN Cuda failure 'out of memory'",
        "Received sigquit from a child process. It usually means the child failed.",
    )


def test_newer_build_warmup_failure_and_health_failure() -> None:
    parser = LogParser()
    parser.feed(read_fixture("newer_build_dp.log"))
    obs = parser.observe()
    assert obs.phase == "warming_up"
    assert not obs.ready_line_seen
    assert obs.health_failed_lines == 1
    assert obs.errors[0].startswith("Initialization failed. warmup error")
    assert obs.errors[1] == "AssertionError: <Response [500]>"
    assert obs.errors[2].startswith("Health check failed.")
    assert obs.last_decode is not None
    assert (obs.last_decode.running_reqs, obs.last_decode.queue_reqs) == (4, 2)
    assert obs.last_decode.accept_len is None


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "Loading safetensors checkpoint shards:  50% Completed | 4/8 [00:02<00:02,  1.77it/s]",
            (4, 8, "shards", "Loading safetensors checkpoint shards", 1.77),
        ),
        (
            "Loading pt checkpoint shards:   0% Completed | 0/8 [00:00<?, ?it/s]",
            (0, 8, "shards", "Loading pt checkpoint shards", None),
        ),
        (
            "Multi-thread loading shards:  12% Completed | 2/16 [00:25<02:55, 12.50s/it]",
            (2, 16, "shards", "Multi-thread loading shards", 0.08),
        ),
        (
            "Capturing batches (bs=160 avail_mem=20.12 GB):  35%|███▌      | 8/23 [00:01<00:02,  5.10it/s]",
            (8, 23, "batches", "Capturing batches", 5.1),
        ),
        (
            "Loading safetensors checkpoint shards: 100% Completed | 163/163 [25:01<00:00,  9.21s/it]",
            (163, 163, "shards", "Loading safetensors checkpoint shards", 1 / 9.21),
        ),
        (
            "Capturing batches (bs=1 avail_mem=1 GB): 100%|██████████| 23/23",
            (23, 23, "batches", "Capturing batches", None),
        ),
        ("Loading safetensors checkpoint shards:  50% Completed | 4/0 [00:02<00:02]", None),
        ("Loading: 150% | 4/8", None),
        ("token usage: 0.50, 4/8 done", None),
        ("50% | 4/8 [00:01<00:01, 2.00it/s]", None),
        ("", None),
    ],
)
def test_parse_progress(text: str, expected: tuple[int, int, str, str, float | None] | None) -> None:
    got = parse_progress(text)
    if expected is None:
        assert got is None
        return
    assert got is not None
    assert (got.done, got.total, got.unit, got.label) == expected[:4]
    if expected[4] is None:
        assert got.rate is None
    else:
        assert got.rate == pytest.approx(expected[4])


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "Decode batch, #running-req: 3, #token: 1234, token usage: 0.01, accept len: 3.12, accept rate: 0.78, "
            "cuda graph: True, gen throughput (token/s): 123.45, #queue-req: 0,",
            (3, 0, 123.45, 3.12),
        ),
        (
            "Decode batch. #queue-req: 7, gen throughput (token/s): 9.5, #running-req: 12, #token: 5",
            (12, 7, 9.5, None),
        ),
        ("Decode batch, #running-req: 2,", (2, 0, 0.0, None)),
        ("Decode batch, accept length: 1.25, #running-req: nan, #queue-req: x", (0, 0, 0.0, 1.25)),
        ("Decode batch, cuda graph: True", None),
        ("Decode batch", None),
        ("Prefill batch. #new-seq: 1, #running-req: 0, #queue-req: 0,", None),
    ],
)
def test_parse_decode(text: str, expected: tuple[int, int, float, float | None] | None) -> None:
    got = parse_decode(text, at=7.0)
    if expected is None:
        assert got is None
        return
    assert got == DecodeStats(
        at=7.0,
        running_reqs=expected[0],
        queue_reqs=expected[1],
        gen_throughput=expected[2],
        accept_len=expected[3],
    )


def test_decode_lines_count_even_when_unparseable() -> None:
    obs = parse(["[2026-11-29 14:00:00 TP0] Decode batch, garbage", "Decode batch, #running-req: 1,"]).observe()
    assert obs.decode_lines_total == 2
    assert obs.last_decode is not None and obs.last_decode.running_reqs == 1


@pytest.mark.parametrize(
    ("text", "rank", "message"),
    [
        ("[2026-11-29 14:00:00 TP0] Load weight begin.", "TP0", "Load weight begin."),
        ("[2026-11-29 14:00:00 DP0 TP1] Load weight begin.", "DP0 TP1", "Load weight begin."),
        ("[2026-11-29 14:00:00.123 TP7] x", "TP7", "x"),
        ("[2026-11-29 14:00:00] Uvicorn running on", "", "Uvicorn running on"),
        ("Load weight begin.", "", "Load weight begin."),
        ("[not a prefix] x", "", "[not a prefix] x"),
    ],
)
def test_split_prefix(text: str, rank: str, message: str) -> None:
    assert split_prefix(text) == (rank, message)


def test_clean_strips_escapes_and_keeps_last_cr_segment() -> None:
    assert clean("\x1b[32mThe server is fired up\x1b[0m") == "The server is fired up"
    assert clean("a 1/8\rb 2/8\r") == "b 2/8"
    assert clean("\x1b[2K\x1b[1A\x1b[0m") == ""


def test_phase_never_moves_back() -> None:
    parser = parse(["Uvicorn running on http://127.0.0.1:30000", "Load weight begin.", "Init torch distributed begin."])
    assert parser.observe().phase == "warming_up"


def test_slow_rank_does_not_look_like_a_draft_load() -> None:
    obs = parse(
        [
            "[2026-11-29 14:00:00 TP0] Load weight begin.",
            "[2026-11-29 14:00:01 TP0] Load weight end. type=LlamaForCausalLM, mem usage=1.0 GB",
            "[2026-11-29 14:00:02 TP1] Load weight begin.",
            "[2026-11-29 14:00:03 TP1] Load weight end. type=LlamaForCausalLM, mem usage=1.0 GB",
        ]
    ).observe()
    assert obs.phase == "loading_weights"


@pytest.mark.parametrize("cls", ["LlamaForCausalLMEagle3", "LlamaForCausalLMEagle", "DeepseekV3ForCausalLMNextN"])
def test_draft_class_alone_means_loading_draft(cls: str) -> None:
    obs = parse(["Load weight begin.", f"Load weight end. type={cls}, dtype=torch.bfloat16"]).observe()
    assert obs.phase == "loading_draft"


def test_draft_graph_capture_after_target_capture_stays_capturing() -> None:
    obs = parse(
        [
            "[t] Load weight begin.",
            "[2026-11-29 14:00:00 TP0] Capture target decode CUDA graph begin.",
            "[2026-11-29 14:00:01 TP0] Capture draft decode CUDA graph begin.",
            "[2026-11-29 14:00:02 TP1] KV Cache is allocated. #tokens: 1",  # a slow rank's late line
        ]
    ).observe()
    assert obs.phase == "capturing_graphs"


def test_ready_line_with_colour_and_prefix() -> None:
    obs = parse(["\x1b[32m[2026-11-29 14:00:00] The server is fired up and ready to roll!\x1b[0m"]).observe()
    assert obs.phase == "serving" and obs.ready_line_seen


@pytest.mark.parametrize(
    "line",
    [
        "RuntimeError: NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.hpp:275, unhandled cuda error",
        "[2026-11-29 14:00:00 TP3] Capture cuda graph failed: CUDA error: an illegal memory access",
        "[2026-11-29 14:00:00] Initialization failed. warmup error: timed out",
        "host:1234:1234 [3] NCCL INFO NCCL WARN Call to ibv_reg_mr failed",
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB.",
        "[2026-11-29 14:00:00] Health check failed. Server couldn't get a response from detokenizer",
    ],
)
def test_error_lines(line: str) -> None:
    obs = parse(["Init torch distributed begin.", line, "an ordinary line"]).observe()
    assert len(obs.errors) == 1
    assert obs.errors[0].endswith(line.split("] ", 1)[-1])


def test_ordinary_lines_are_not_errors() -> None:
    obs = parse(['INFO:     127.0.0.1:1 - "GET /health HTTP/1.1" 200 OK', "Load weight end. mem usage=1 GB"]).observe()
    assert obs.errors == ()


def test_traceback_records_its_last_line_once() -> None:
    obs = parse(
        [
            "Traceback (most recent call last):",
            '  File "x.py", line 1, in <module>',
            '    raise RuntimeError("NCCL error: unhandled system error")',
            "RuntimeError: NCCL error: unhandled system error",
            "Loading safetensors checkpoint shards:  50% Completed | 4/8 [00:02<00:02,  1.77it/s]",
        ]
    ).observe()
    assert obs.errors == ("RuntimeError: NCCL error: unhandled system error",)
    assert obs.progress is not None and obs.progress.done == 4


def test_traceback_ended_by_a_non_exception_line_records_nothing() -> None:
    obs = parse(["Traceback (most recent call last):", '  File "x.py"', "just text", "KeyboardInterrupt"]).observe()
    assert obs.errors == ()


def test_errors_are_bounded_newest_last() -> None:
    obs = parse([f"CUDA error: number {i}" for i in range(50)]).observe()
    assert len(obs.errors) == 20
    assert obs.errors[-1] == "CUDA error: number 49"
    assert obs.errors[0] == "CUDA error: number 30"


def test_health_failed_lines_are_counted() -> None:
    obs = parse(["Health check failed. Server couldn't get a response from detokenizer"] * 3).observe()
    assert obs.health_failed_lines == 3


def test_progress_cleared_when_phase_moves_on() -> None:
    obs = parse(
        [
            "Load weight begin.",
            "Loading safetensors checkpoint shards: 100% Completed | 8/8 [00:04<00:00,  1.77it/s]",
            "KV Cache is allocated. #tokens: 100",
        ]
    ).observe()
    assert obs.phase == "allocating_kv"
    assert obs.progress is None


def test_capture_bar_alone_moves_to_capturing() -> None:
    obs = parse(["Capturing batches (bs=8 avail_mem=1.00 GB):  50%|█████     | 1/2 [00:01<00:01, 1.00it/s]"]).observe()
    assert obs.phase == "capturing_graphs"
    assert obs.progress is not None and obs.progress.unit == "batches"


def test_empty_parser() -> None:
    obs = LogParser().observe()
    assert (obs.lines_total, obs.last_line_at, obs.phase, obs.progress) == (0, None, "spawning", None)


GARBAGE = [
    "\ufffd\ufffd\x00\x01\x02PK\x03\x04\ufffd" * 50,
    "x" * 4096,
    "\x1b[0m\x1b[1;31m\x1b[2K" * 300,
    "",
    "\r\r\r",
    "[" * 4096,
    "%/" * 2048,
]


def test_garbage_is_counted_and_harmless() -> None:
    parser = parse(GARBAGE)
    obs = parser.observe()
    assert obs.lines_total == len(GARBAGE)
    assert obs.phase == "spawning"
    assert obs.errors == ()


HOSTILE = [
    "L" + "a" * 190 + ":  5%" + " " * 3900 + "1/",
    "Loading shards:  50%" + "|" * 4000 + "9" * 12 + "/",
    "Loading shards:  50% Completed | 4/8 [" + "1" * 4000,
    "Decode batch, " + "#running-req: 1, " * 240,
    "Decode batch" + ":" * 4084,
    "[2026-11-29 14:00:00" + " TP0" * 1019,
    "\x1b[" + "0;" * 2046 + "m",
    "Load weight end. type=" + "Eagle" * 815,
    "99/" * 1365,
    "a." * 2048,
    "Traceback (most recent call last):" + " " * 4062,
]


@pytest.mark.parametrize("line", HOSTILE)
def test_hostile_line_is_fast(line: str) -> None:
    assert len(line) <= 4200
    parser = LogParser()
    lines = lines_of([line] * 50)
    started = time.perf_counter()
    parser.feed(lines)
    parser.feed(lines_of(["Traceback (most recent call last):", line] * 25))
    elapsed = time.perf_counter() - started
    # Catastrophic backtracking on a 4 KB line takes minutes; 2 s leaves room for a loaded CI machine.
    assert elapsed < 2.0, f"100 hostile lines took {elapsed:.3f} s"


FRAGMENTS = [
    "[2026-11-29 14:00:00 TP0] ",
    "[2026-11-29 14:00:00 DP1 TP3] ",
    "Load weight begin. ",
    "Load weight end. type=LlamaForCausalLMEagle3 ",
    "KV Cache is allocated. ",
    "Capture cuda graph begin. ",
    "Capture draft decode CUDA graph begin. ",
    "Uvicorn running on ",
    "The server is fired up and ready to roll!",
    "Traceback (most recent call last):",
    "  File ",
    "RuntimeError: ",
    "Decode batch, #running-req: ",
    "Loading safetensors checkpoint shards: ",
    " 50% Completed | 4/8 [00:02<00:02,  1.77it/s]",
    "3.5s/it",
    "Health check failed.",
    "\x1b[0m",
    "\r",
    "\ufffd",
    ", ",
    ": ",
    "1",
]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.text(max_size=300), st.lists(st.sampled_from(FRAGMENTS), max_size=12).map("".join))))
def test_fuzz_feed_never_raises(texts: list[str]) -> None:
    parser = LogParser()
    served = False
    for line in lines_of(texts):
        parser.feed([line])
        obs = parser.observe()
        if served:
            assert obs.phase == "serving"
        served = obs.phase == "serving"
        assert len(obs.errors) <= 20
        assert obs.progress is None or obs.progress.total > 0
    assert parser.observe().lines_total == len(texts)
