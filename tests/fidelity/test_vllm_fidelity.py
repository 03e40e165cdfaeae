"""The simulator's vLLM mode held against vLLM 0.26.0's own source.

tests/fixtures/vllm_source/reference.json holds what the source has at every place the simulator cites
(extract.py writes it from an unpacked vLLM; this test needs only the JSON): each logger call's level
and format string, the other strings (titles, bars, tracebacks' code lines), and the metric families
of v1/metrics/loggers.py and v1/spec_decode/metrics.py. Then real runs of the simulator: every record
it prints names a `[file:line]` the fixture has, at that call's level, and its message is that call's
format string filled in; every `vllm:` family it exposes is one of the source's, with its type,
documentation, labels and buckets.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from freeport import free_port
from prometheus_client.parser import text_string_to_metric_families

from probes.proctree import MARKER_ENV
from supervisor.process import kill_marked
from supervisor.simulator.vllm import crashes as vllm_crashes
from supervisor.simulator.vllm import lines as vllm_lines
from supervisor.simulator.vllm.metrics import build_1_2_5_buckets

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
REFERENCE = json.loads((ROOT / "tests/fixtures/vllm_source/reference.json").read_text(encoding="utf-8"))
SPEC = '{"method": "eagle3", "model": "/models/draft", "num_speculative_tokens": 3}'
# Built at run time in vLLM (a variable, a concatenation): each is checked through the SourceTexts that make it.
DYNAMIC = {
    ("entrypoints/serve/utils/api_utils.py", 345): vllm_lines.LOGO_LINES,
    ("v1/metrics/loggers.py", 310): vllm_lines.STATS_PARTS,
    ("compilation/monitor.py", 53): vllm_lines.TORCH_COMPILE_MESSAGE,
    ("distributed/device_communicators/shm_broadcast.py", 705): vllm_lines.SHM_LONG_WAIT_MESSAGE,
}
# Families vLLM creates only under options the simulator does not model (a KV connector, LoRA,
# --kv-cache-metrics, VLLM_COMPUTE_NANS_IN_LOGITS; loggers.py:575-660, 862-1028, 1031-1053).
NOT_BY_DEFAULT = {
    "vllm:external_prefix_cache_queries",
    "vllm:external_prefix_cache_hits",
    "vllm:kv_block_lifetime_seconds",
    "vllm:kv_block_idle_before_evict_seconds",
    "vllm:kv_block_reuse_gap_seconds",
    "vllm:lora_requests_info",
    "vllm:corrupted_requests",
}
HEADER = re.compile(
    r"^(?:\((?P<proc>\w+) pid=\d+\) )?(?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL) "
    r"\d\d-\d\d \d\d:\d\d:\d\d \[(?P<file>[\w.]+):(?P<line>\d+)\] (?P<message>.*)$",
    re.S,
)
_CONVERSION = re.compile(r"%(?:\([^)]*\))?[-+ #0]*\d*(?:\.\d+)?[sdrfxg%]")


def template_regex(template: str) -> re.Pattern[str]:
    """A %-format string as a pattern: its fixed text literal, each conversion any text (a full match)."""
    out, pos = [], 0
    for m in _CONVERSION.finditer(template):
        out.append(re.escape(template[pos : m.start()]))
        out.append("%" if m.group() == "%%" else ".*?")
        pos = m.end()
    out.append(re.escape(template[pos:]))
    return re.compile("".join(out) + r"(?:\n.*)?", re.S)  # logger.exception adds its traceback after a newline


def sites_by_place() -> dict[tuple[str, int], list[tuple[str, dict[str, object]]]]:
    """(file name, line) -> the fixture's entries there (two files of one name may share a line)."""
    out: dict[tuple[str, int], list[tuple[str, dict[str, object]]]] = {}
    for key, entry in REFERENCE["log_sites"].items():
        path, line = key.rsplit(":", 1)
        out.setdefault((os.path.basename(path), int(line)), []).append((path, entry))
    return out


def catalogue_template(path: str, line: int) -> str:
    for site in vllm_lines.all_log_sites():
        if (site.path, site.line) == (path, line):
            return site.template
    raise AssertionError(f"{path}:{line} is not in the simulator's catalogue")


def records(stdout: str) -> Iterator[tuple[str, str, int, str]]:
    """(level, file, line, message) of every record. NewLineFormatter turns a record's inner newlines into
    `\r\n` + the header again (logging_utils/formatter.py:74): such lines are joined back into one message."""
    lines = stdout.split("\n")
    i = 0
    while i < len(lines):
        raw = lines[i]
        i += 1
        first = HEADER.match(raw.rstrip("\r"))
        if first is None:
            continue
        message = first["message"]
        while raw.endswith("\r") and i < len(lines):
            raw = lines[i]
            i += 1
            more = HEADER.match(raw.rstrip("\r"))
            message += "\n" + (more["message"] if more else raw.rstrip("\r"))
        yield first["level"], first["file"], int(first["line"]), message


# --- the catalogue against the source --------------------------------------------------------------------------
def test_fixture_is_vllm_0_26_0() -> None:
    assert REFERENCE["vllm_version"] == vllm_lines.VLLM_VERSION == "0.26.0"


def test_every_cited_log_call_is_the_sources() -> None:
    for site in vllm_lines.all_log_sites():
        entry = REFERENCE["log_sites"].get(f"{site.path}:{site.line}")
        assert entry is not None, f"no logger call at vllm/{site.path}:{site.line}"
        assert entry["level"] == site.level, site
        if entry["template"] is None:
            assert (site.path, site.line) in DYNAMIC, site
            assert (
                f"{DYNAMIC[site.path, site.line].path}:{DYNAMIC[site.path, site.line].line}"
                in REFERENCE["source_texts"]
            )
        else:
            assert entry["template"] == site.template, site


def test_every_cited_string_is_the_sources() -> None:
    for text in vllm_crashes.all_source_texts():
        assert REFERENCE["source_texts"].get(f"{text.path}:{text.line}") == text.text, text


# --- real runs -------------------------------------------------------------------------------------------------
@dataclass
class Run:
    stdout: str
    stderr: str
    metrics: str
    titles: list[str]


def _request(url: str, body: object = None, timeout: float = 20.0) -> tuple[int, bytes]:
    data = None if body is None else json.dumps(body).encode()
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(urllib.request.Request(url, data=data), timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except OSError:
        return 0, b""


def run_sim(tmp_path: Path, scenario: str, flags: list[str], env: dict[str, str], requests: int, tp: int) -> Run:
    """Start, wait for ready (or the end), send completions, scrape, SIGTERM, collect both streams."""
    marker = f"vllmfid-{uuid.uuid4().hex[:10]}"
    port = free_port()
    argv = [sys.executable, "-m", "supervisor.simulator", "--engine", "vllm", "--model", "/models/sim", "-tp", str(tp)]
    argv += [*flags, "--host", "127.0.0.1", "--port", str(port)]
    full_env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        MARKER_ENV: marker,
        "SPT_NOENV": "1",
        "SGLANG_SIM_SCENARIO": scenario,
        "SGLANG_SIM_PACE": "0.2",
        "SGLANG_SIM_FAULT_AFTER_S": "0.3",
        **env,
    }
    out_path, err_path = tmp_path / f"{scenario}.out", tmp_path / f"{scenario}.err"
    base = f"http://127.0.0.1:{port}"
    metrics, titles = "", []
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        proc = subprocess.Popen(argv, env=full_env, cwd=ROOT, stdout=out, stderr=err, start_new_session=True)
    try:
        deadline = time.monotonic() + 40
        while time.monotonic() < deadline and proc.poll() is None:
            if b"Application startup complete." in err_path.read_bytes():
                break
            time.sleep(0.05)
        if proc.poll() is None:
            titles = _titles(marker)
            for _ in range(requests):
                _request(base + "/v1/completions", {"prompt": "Hello, my name is", "max_tokens": 40})
            time.sleep(1.2)  # a stats interval
            metrics = _request(base + "/metrics")[1].decode()
            os.kill(proc.pid, signal.SIGTERM)
        proc.wait(30)
    finally:
        kill_marked(marker, grace_s=0.2)
    out, err = (p.read_bytes().decode("utf-8", "replace") for p in (out_path, err_path))  # keep the \r of \r\n
    return Run(out, err, metrics, titles)


def _titles(marker: str) -> list[str]:
    import psutil

    found = []
    for proc in psutil.process_iter(["cmdline", "environ"]):
        try:
            if (proc.info["environ"] or {}).get(MARKER_ENV) == marker and proc.info["cmdline"]:
                found.append(proc.info["cmdline"][0])
        except psutil.Error:
            continue
    return found


RUNS = {
    "tp2-eagle3": ("ok", ["--speculative-config", SPEC], {"VLLM_LOG_STATS_INTERVAL": "0.5"}, 3, 2),
    "ngram-v1-runner": ("ok", ["--speculative-config", '{"method": "ngram", "num_speculative_tokens": 2}'], {}, 1, 1),
    "eager-crash": ("crash_after_ready", ["--enforce-eager"], {}, 1, 1),
    "oom-tp2": ("crash_on_load", [], {}, 0, 2),
    "stall-tp2": (
        "serving_stall",
        [],
        {"VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS": "3", "VLLM_RINGBUFFER_WARNING_INTERVAL": "1"},
        1,
        2,
    ),
    "rank-dies-tp1": ("rank_dies", [], {}, 0, 1),
}


@pytest.mark.parametrize("name", list(RUNS))
def test_every_record_is_a_source_call_filled_in(tmp_path: Path, name: str) -> None:
    scenario, flags, env, requests, tp = RUNS[name]
    run = run_sim(tmp_path, scenario, flags, env, requests, tp)
    places = sites_by_place()
    seen = 0
    for level, filename, line, message in records(run.stdout):
        candidates = places.get((filename, line))
        assert candidates, f"[{filename}:{line}] is no logger call the simulator cites: {message[:120]!r}"
        matched = False
        for path, entry in candidates:
            template = entry["template"] if entry["template"] is not None else catalogue_template(path, line)
            assert isinstance(template, str)
            if entry["level"] == level and template_regex(template).fullmatch(message):
                matched = True
        assert matched, f"[{filename}:{line}] {level} {message[:200]!r} is not its source's format"
        seen += 1
    assert seen > 20
    for bar in re.findall(r"\r?((?:Loading|Capturing)[^:|]*):", run.stderr):
        assert bar in ("Loading safetensors checkpoint shards",) or re.fullmatch(
            r"Capturing (CUDA graphs \((PIECEWISE|FULL|mixed prefill-decode, PIECEWISE|decode, FULL)\)|"
            r"(prefill|decode) CUDA graphs \((PIECEWISE|FULL)\))",
            bar,
        ), bar
    for title in run.titles:
        assert not title.startswith("VLLM::") or re.fullmatch(r"VLLM::(EngineCore|Worker(_TP\d+)?)", title), title


def test_metric_families_are_the_sources(tmp_path: Path) -> None:
    scenario, flags, env, requests, tp = RUNS["tp2-eagle3"]
    run = run_sim(tmp_path, scenario, flags, env, requests, tp)
    families = {
        f.name: f
        for f in text_string_to_metric_families(run.metrics)
        if f.name.startswith("vllm:") and not f.name.endswith("_created")  # a counter's timestamp, not a family
    }
    source = REFERENCE["metrics"]
    assert set(families) == set(source) - NOT_BY_DEFAULT
    for name, family in families.items():
        want = source[name]
        assert family.type == want["type"], name
        assert family.documentation == want["documentation"], name
        labels = {k for s in family.samples for k in s.labels if k != "le"}
        assert labels == set(want["labelnames"]), name
        if want["type"] == "histogram":
            bounds = sorted(float(s.labels["le"]) for s in family.samples if "le" in s.labels)[:-1]
            buckets = want["buckets"]
            if buckets == "build_1_2_5_buckets(max_model_len)":
                buckets = build_1_2_5_buckets(131072)
            if isinstance(buckets, list):
                assert bounds == [float(b) for b in buckets], name
