"""The probes and parsers over every real SGLang transcript in tests/fixtures/real_sglang/.

What real SGLang printed, served and named its processes, fed through the daemon's own code: the log
parser (phase, progress, ready line, decode lines, errors), the metrics parser (names, labels,
values), /get_server_info, the /health answers, and roles from the process titles over time.
"""

from __future__ import annotations

import datetime as dt
import itertools

import pytest
from prometheus_client.parser import text_string_to_metric_families
from transcripts import RUNS, Transcript, stamp_of

from probes.logs import LogParser, parse_decode, split_prefix
from probes.proctree import role_of
from probes.serving import accept_length_from_server_info, parse_metrics

pytestmark = pytest.mark.skipif(not RUNS, reason="no transcript under tests/fixtures/real_sglang")
SCHEDULER_LABELS = {"engine_type", "model_name", "moe_ep_rank", "pp_rank", "tp_rank"}


@pytest.fixture(params=RUNS)
def run(request: pytest.FixtureRequest) -> Transcript:
    return Transcript(request.param)


def phases(run: Transcript) -> tuple[list[str], LogParser]:
    """The parser's phase after every line of the server's output, in order, repeats dropped."""
    parser = LogParser()
    seen = ["spawning"]
    for line in sorted(run.lines("stderr") + run.lines("stdout"), key=lambda x: x.seq):
        parser.feed([line])
        phase = parser.observe().phase
        if phase != seen[-1]:
            seen.append(phase)
    return seen, parser


def test_the_phases_come_in_order_and_end_serving(run: Transcript) -> None:
    seen, parser = phases(run)
    obs = parser.observe()
    assert obs.ready_line_seen and obs.phase == "serving"
    for phase in ("initializing", "loading_weights", "allocating_kv", "capturing_graphs", "warming_up", "serving"):
        assert phase in seen, seen
    if run.speculative:
        assert "loading_draft" in seen, seen
    assert seen.index("capturing_graphs") < seen.index("warming_up") < seen.index("serving")


def test_progress_bars_parse_as_shards_and_capture_steps(run: Transcript) -> None:
    parser = LogParser()
    units: dict[str, set[str]] = {}
    for line in run.lines("stderr"):
        parser.feed([line])
        obs = parser.observe()
        if obs.progress is not None:
            units.setdefault(obs.progress.unit, set()).add(obs.phase)
    assert "loading_weights" in units.get("shards", set()) or "loading_draft" in units.get("shards", set()), units
    assert "capturing_graphs" in units.get("batches", set()), units
    assert "items" not in units, units  # every bar SGLang draws at start-up is understood


def test_every_decode_line_parses(run: Transcript) -> None:
    decode = [m for m in run.messages() if "Decode batch" in m]
    assert decode, "the transcript has no load: no decode line"
    for text in decode:
        stats = parse_decode(split_prefix(text)[1], 0.0)
        assert stats is not None, text
        assert stats.gen_throughput >= 0 and stats.running_reqs >= 0
        if run.speculative:
            assert stats.accept_len is not None and stats.accept_len >= 1.0, text
    _, parser = phases(run)
    obs = parser.observe()
    assert obs.decode_lines_total == len(decode) and obs.last_decode is not None


def test_rank_tags_match_the_tp_size(run: Transcript) -> None:
    tags = {split_prefix(m)[0] for m in run.messages() if m.startswith("[")}
    if run.tp_size == 1:
        assert tags == {""}, tags  # 0.5.16 prints no rank tag at tp-size 1
    else:
        assert {f"TP{r}" for r in range(run.tp_size)} <= tags, tags


def test_importing_sglang_is_a_long_silence_after_server_args(run: Transcript) -> None:
    """The fact the watchdog must live through: no line for many seconds while the children import
    SGLang, between `server_args=` and the first rank's first line."""
    stamped = [(s, m) for m in run.messages() if (s := stamp_of(m)) is not None]
    start = next(i for i, (_, m) in enumerate(stamped) if "server_args=" in m)
    end = next(i for i, (_, m) in enumerate(stamped) if "Init torch distributed begin" in m or "Load weight begin" in m)
    times = [dt.datetime.fromisoformat(s) for s, _ in stamped[start : end + 1]]
    gap = max(b - a for a, b in itertools.pairwise(times))
    assert gap.total_seconds() >= 5, gap


def test_no_error_is_reported_before_ready(run: Transcript) -> None:
    parser = LogParser()
    for line in run.lines("stderr"):
        parser.feed([line])
        if parser.observe().ready_line_seen:
            break
    assert parser.observe().errors == ()


def test_metrics_parse_with_0516_labels(run: Transcript) -> None:
    for phase, running in (("idle", False), ("load", True), ("stalled", True)):
        text = run.metrics(phase)
        if text is None:
            continue
        obs = parse_metrics(text, 0.0)
        assert obs.available, obs.error
        assert (obs.running_reqs or 0) > 0 if running else (obs.running_reqs or 0) == 0, (phase, obs)
        families = {f.name: f for f in text_string_to_metric_families(text)}
        if running:  # under load every series the watchdog reads exists
            assert obs.decode_tokens_total is not None and obs.generation_tokens_total is not None
            assert obs.spec_accept_length is not None or not run.speculative
            assert "sglang:num_running_reqs" in families
        if "sglang:num_running_reqs" in families:
            running_family = families["sglang:num_running_reqs"]
            assert {k for s in running_family.samples for k in s.labels} >= SCHEDULER_LABELS
    load = run.metrics("load")
    assert load is not None and (parse_metrics(load, 0.0).gen_throughput or 0) > 0


def test_server_info_carries_what_the_probe_reads(run: Transcript) -> None:
    info = run.json("server_info.json")
    assert isinstance(info, dict)
    state = info["internal_states"][0]
    assert "last_gen_throughput" in state and "memory_usage" in state
    assert info["tp_size"] == run.tp_size
    # Taken 3 s after ready: SGLang adds verify steps to its totals only when it logs a decode line,
    # so after a short warm-up there is no `avg_spec_accept_length` yet (and the probe reads None).
    accept = accept_length_from_server_info(info)
    assert (accept is None) == ("avg_spec_accept_length" not in state)
    assert accept is None or accept >= 1.0
    model = run.json("model_info.json")
    assert isinstance(model, dict) and model["is_generation"] is True


def test_health_answers_by_phase(run: Transcript) -> None:
    assert run.health_in("starting") and run.health_in("ready")
    for r in run.health_in("ready"):
        assert r.status == 200, r
    for r in run.health_in("starting"):
        assert r.status in (None, 503), r  # refused before the bind, 503 while it warms up
    for r in run.health_in("stalled"):
        assert r.status != 200, r  # a stopped scheduler: 503 after SGLang's timeout, or no answer


def roles_at(run: Transcript, t: float) -> list[tuple[str, int | None, str]]:
    """Roles of the main process and its direct children at one sample (grandchildren, such as a
    compiler's worker pool, are no rank)."""
    root_pid = run.root_pid()
    rows = [r for r in run.state_at(t) if r.pid == root_pid or r.ppid == root_pid]
    root = next((r for r in rows if r.pid == root_pid), None)
    if root is None:
        return []
    return [
        (*role_of(r.title, r.pid == root.pid, root.title if r.ppid == root.pid else None), r.title) for r in rows
    ]


def test_roles_from_the_titles_over_time(run: Transcript) -> None:
    times = sorted({r.t for r in run.titles()})
    stop = run.mark("sigterm")
    if stop is not None:  # the tree going down is not what is tested here
        times = [t for t in times if t < stop]
    last = roles_at(run, times[-1])
    schedulers = sorted(rank for role, rank, _ in last if role == "scheduler")
    assert schedulers == list(range(run.tp_size)), last
    assert [role for role, _, _ in last].count("detokenizer") == 1 and [r for r, _, _ in last].count("main") == 1
    for t in times:
        for role, _, title in roles_at(run, t):
            # Before a child names itself it is `pending`, never an unexplained `other`.
            assert role != "other" or "resource_tracker" in title, (t, title)
    early = [roles_at(run, t) for t in times]
    assert any(role == "pending" for sample in early for role, _, _ in sample), "titles were never seen unset"
