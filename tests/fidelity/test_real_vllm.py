"""The daemon's vLLM profile over what real vLLM 0.26.0 printed under it (tests/fixtures/real_vllm/).

One fixture is the daemon's own server.log of issue 37's GPU lane (bench/real/lanes37.py): five launches
of a tiny Llama with a random EAGLE-3 draft on an H100, torch.compile and CUDA graphs on. Each launch
is fed, line by line, through the log parser and the launch timeline with vLLM's grammar, as the
daemon reads it. meta.json says how each launch ended.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from probes.logs import LogParser, parse_vllm_accept, split_prefix
from probes.types import LogLine, LogObservation
from supervisor.engines import VLLM
from supervisor.warmstart.timeline import Milestones, milestone_of, views

ROOT = Path(__file__).resolve().parents[1] / "fixtures" / "real_vllm"
RUNS = sorted(p for p in ROOT.iterdir() if (p / "meta.json").exists()) if ROOT.exists() else []
# Each launch is one API server: a new pid in `(APIServer pid=N) ` begins the next (its logo first).
_API = re.compile(r"^\(APIServer pid=(\d+)\) ")
_BAR = re.compile(r"\d+%\|| Completed \| ")  # tqdm bars go to stderr

pytestmark = pytest.mark.skipif(not RUNS, reason="no transcript under tests/fixtures/real_vllm")


def launches(run: Path) -> list[list[str]]:
    out: list[list[str]] = []
    pids: set[str] = set()
    for text in (run / "server.log").read_text(errors="replace").splitlines():
        api = _API.match(text)
        if api and api.group(1) not in pids:
            pids.add(api.group(1))
            out.append([])
        if out:
            out[-1].append(text)
    return out


def as_lines(texts: list[str]) -> list[LogLine]:
    return [
        LogLine(seq=i, at=float(i), stream="stderr" if _BAR.search(t) else "stdout", text=t)
        for i, t in enumerate(texts, 1)
    ]


def parse(texts: list[str]) -> tuple[list[str], LogObservation]:
    parser = LogParser(VLLM.log)
    seen = ["spawning"]
    for line in as_lines(texts):
        parser.feed([line])
        if parser.observe().phase != seen[-1]:
            seen.append(parser.observe().phase)
    return seen, parser.observe()


@pytest.fixture(params=RUNS, ids=lambda p: p.name)
def run(request: pytest.FixtureRequest) -> tuple[list[list[str]], list[dict[str, object]]]:
    meta = json.loads((request.param / "meta.json").read_text())
    found = launches(request.param)
    assert len(found) == len(meta["launches"]), (len(found), [t[0][:80] for t in found])
    return found, meta["launches"]


def test_every_served_launch_passes_the_phases_in_order(run) -> None:  # type: ignore[no-untyped-def]
    found, meta = run
    for texts, m in zip(found[1:], meta[1:], strict=True):
        seen, obs = parse(texts)
        want = ["spawning", "initializing", "loading_weights"]
        want += ["loading_draft"] if m["speculative"] else []
        want += ["allocating_kv", "capturing_graphs", "warming_up"]
        assert seen == want, (m["rung"], seen)
        assert not obs.ready_line_seen  # vLLM prints none: the daemon's port and canary say ready


def test_the_deadlocked_launch_stops_after_its_models_loaded(run) -> None:  # type: ignore[no-untyped-def]
    # "Model loading took" ends both loads; the profiling run that follows is where it hung: the
    # verdict's phase says allocating_kv, not the draft's load it had finished.
    seen, _ = parse(run[0][0])
    assert seen[-1] == "allocating_kv" and "loading_draft" in seen, seen


def test_the_timeline_names_the_compile_where_vllm_compiles(run) -> None:  # type: ignore[no-untyped-def]
    for texts in run[0][1:]:
        ms = Milestones(launched_at=0.0, grammar=VLLM.log)
        ms.feed(as_lines(texts))
        order = [v.name for v in views(ms.offsets())]
        # The engine's config dump names inductor: it is not the compile (it once was, 28 s early).
        assert order == ["spawn", "weights_loading", "weights_loaded", "compile", "kv_allocated", "graph_capture",
                         "warmup"], order
        first = next(t for t in texts if "Initializing a V1 LLM engine" in t)
        assert "inductor" in first and milestone_of(split_prefix(first, "level")[1], VLLM.log) is None


def test_stats_and_acceptance_lines_parse(run) -> None:  # type: ignore[no-untyped-def]
    found, _ = run
    spec = [t for t in found[1] if "SpecDecoding metrics" in t]
    assert spec and all(parse_vllm_accept(split_prefix(t, "level")[1]) == 1.0 for t in spec)  # the random draft
    _, obs = parse(found[2])  # the stalled launch: its last stats line still says 4 running
    assert obs.last_decode is not None and obs.last_decode.running_reqs == 4 and obs.decode_lines_total >= 2


def test_the_killed_engine_core_leaves_its_error_in_the_log(run) -> None:  # type: ignore[no-untyped-def]
    _, obs = parse(run[0][3])
    assert any("EngineDeadError" in e for e in obs.errors), obs.errors
