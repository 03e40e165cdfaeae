"""Issue 51's wedges that /health does not see, as the simulator serves them: SGLang #40809 (the scheduler's
loop turns and admits nothing: requests queue, none starts) and #28815 (an EAGLE verify step skips its
broadcast on rank 0: the peers wait in it for good, the running batch never finishes). Both answer
/health 200 and print nothing."""

from __future__ import annotations

import contextlib
import re
import threading
import time
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from conftest import Sim, SimStarter

pytestmark = pytest.mark.integration

READY = "The server is fired up and ready to roll!"
FAST_FAULT = {"SGLANG_SIM_FAULT_AFTER_S": "0.5", "SGLANG_HEALTH_CHECK_TIMEOUT": "1", "SGLANG_SIM_IDLE_METRICS_S": "0.3"}
SPEC = ("--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", "/models/draft")


def sample(text: str, name: str, **labels: str) -> float:
    """The value of the first sample of `name` whose labels include `labels`."""
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            got = dict(re.findall(r'(\w+)="([^"]*)"', line.split("}", 1)[0]))
            if all(got.get(k) == v for k, v in labels.items()):
                return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} {labels} not in /metrics")


def in_background(s: Sim, n: int, timeout: float) -> list[threading.Thread]:
    def run() -> None:
        with contextlib.suppress(OSError):  # the timeout: the request never finishes
            s.generate(8, timeout)

    threads = [threading.Thread(target=run, daemon=True) for _ in range(n)]
    for t in threads:
        t.start()
    return threads


def test_queue_wedge_queues_requests_and_health_stays_200(sim: SimStarter) -> None:
    s = sim("queue_wedge", "--enable-metrics", "--decode-log-interval", "5", tp=1, env=FAST_FAULT)
    assert s.wait_log(READY)
    assert s.generate(8)[0] == 200  # before the wedge it serves
    assert s.wait_until(lambda: s.onset_path.exists() and s.onset().get("onset_wall") is not None, 10)
    text = s.request("/metrics")[1].decode()
    tokens = sample(text, "sglang:realtime_tokens_total", mode="decode")
    started = sample(text, "sglang:queue_time_seconds_count")
    in_background(s, 3, 6.0)
    # The loop turns: its republished gauges say 3 queued and none running.
    assert s.wait_until(lambda: sample(s.request("/metrics")[1].decode(), "sglang:num_queue_reqs") == 3, 5)
    log_before = s.stderr()
    assert s.request("/health")[0] == 200  # /health cannot see it
    text = s.request("/metrics")[1].decode()
    assert sample(text, "sglang:num_running_reqs") == 0
    assert sample(text, "sglang:realtime_tokens_total", mode="decode") == tokens
    assert sample(text, "sglang:queue_time_seconds_count") == started  # none left the queue
    assert 'sglang:http_requests_active{endpoint="/generate",method="POST"} 3.0' in text
    assert "Prefill batch" not in s.stderr()[len(log_before) :]  # nothing admitted, nothing said
    assert s.onset()["scenario"] == "queue_wedge"


def test_verify_skips_broadcast_freezes_the_running_batch_health_200(sim: SimStarter) -> None:
    s = sim("verify_skips_broadcast", "--enable-metrics", "--decode-log-interval", "5", *SPEC, tp=2, env=FAST_FAULT)
    assert s.wait_log(READY)
    assert s.wait_until(lambda: s.onset_path.exists() and s.onset().get("onset_wall") is not None, 10)
    in_background(s, 2, 8.0)  # admitted (a prefill), then the first verify step skips its broadcast
    assert s.wait_until(lambda: "Prefill batch" in s.stderr(), 5)
    time.sleep(0.5)
    text = s.request("/metrics")[1].decode()
    tokens = sample(text, "sglang:realtime_tokens_total", mode="decode")
    finished = sample(text, "sglang:generation_tokens_total")  # the warm-up's

    def held() -> tuple[float, float]:
        text = s.request("/metrics")[1].decode()
        return sample(text, "sglang:num_running_reqs"), sample(text, "sglang:num_queue_reqs")

    # One batch was admitted and froze in its verify step; one that came later may wait behind it.
    assert s.wait_until(lambda: held()[0] >= 1 and sum(held()) == 2, 5), held()
    time.sleep(1.0)
    assert s.request("/health")[0] == 200
    text = s.request("/metrics")[1].decode()
    assert sample(text, "sglang:realtime_tokens_total", mode="decode") == tokens
    assert sample(text, "sglang:generation_tokens_total") == finished  # none of ours finished
    assert "Decode batch" not in s.stderr()
    assert s.onset()["scenario"] == "verify_skips_broadcast"


def test_verify_skips_broadcast_needs_a_verify_step_and_a_peer(sim: SimStarter) -> None:
    s = sim("verify_skips_broadcast", "--enable-metrics", tp=2, env=FAST_FAULT)  # no speculation
    assert s.wait_log(READY)
    time.sleep(1.0)
    assert s.generate(8)[0] == 200
    assert s.onset_path.exists() is False or s.onset().get("onset_wall") is None
