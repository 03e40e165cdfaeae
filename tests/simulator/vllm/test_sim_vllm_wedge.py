"""Issue 51: vLLM's admission wedge as the simulator serves it (vLLM #53130's shape, SGLang #40809's):
the engine core's loop turns and admits nothing, requests wait, `/health` (a flag) stays 200, nothing
is printed."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import pytest
from simrequests import in_background, sample

if TYPE_CHECKING:
    from conftest import SimStarter

pytestmark = pytest.mark.integration

READY = "Application startup complete."
FAST = {"SGLANG_SIM_FAULT_AFTER_S": "0.3"}


def test_queue_wedge_queues_requests_health_200_and_prints_nothing(vsim: SimStarter) -> None:
    s = vsim("queue_wedge", tp=1, env=FAST)
    assert s.wait_out(READY)
    time.sleep(1.0)  # past FAULT: the scheduler's next step admits nothing (its onset)
    tokens = sample(s, "vllm:generation_tokens_total")
    started = sample(s, "vllm:request_queue_time_seconds_count")
    out, err = s.stdout(), s.stderr()
    waiting = [in_background(s, {"prompt": "hi", "max_tokens": 8}, 8) for _ in range(3)]
    assert s.wait_until(lambda: s.onset_path.exists() and s.onset().get("onset_wall") is not None, 10)
    assert s.wait_until(lambda: sample(s, "vllm:num_requests_waiting") == 3, 5)
    time.sleep(0.5)
    assert sample(s, "vllm:num_requests_running") == 0
    assert sample(s, "vllm:generation_tokens_total") == tokens
    assert sample(s, "vllm:request_queue_time_seconds_count") == started
    assert s.request("/health") == (200, b"")  # the flag cannot see it
    assert all("status" not in w for w in waiting)
    # nothing printed for the detector: only the access lines of what we asked
    new = (s.stdout()[len(out) :] + s.stderr()[len(err) :]).splitlines()
    assert all("GET /" in line or "POST /" in line for line in new if line.strip()), new
    assert s.onset()["scenario"] == "queue_wedge"
