"""vLLM mode across two nodes: `--nnodes 2` on the head, `--headless` on node 1 (vLLM 0.26.0
entrypoints/cli/serve.py:168-219): the group meets at --master-addr:--master-port, the head serves, the
headless node runs its workers and no HTTP at all."""

from __future__ import annotations

import re
import time
from typing import TYPE_CHECKING

import psutil
import pytest
from freeport import free_port

if TYPE_CHECKING:
    from conftest import SimStarter

pytestmark = pytest.mark.integration


def listening(port: int) -> bool:
    return any(c.laddr and c.laddr.port == port and c.status == "LISTEN" for c in psutil.net_connections("tcp"))


def test_head_serves_and_the_headless_node_has_no_http(vsim: SimStarter) -> None:
    store = str(free_port())
    group = ("--nnodes", "2", "--master-addr", "127.0.0.1", "--master-port", store)
    head = vsim("ok", *group, tp=2)
    time.sleep(1.0)
    assert "Application startup complete." not in head.stderr()  # rank 0 waits for rank 1 at the store
    node1 = vsim("ok", *group, "--node-rank", "1", "--headless", tp=2)
    assert head.wait_out("Application startup complete.", timeout=40)
    status, _ = head.request("/v1/completions", {"prompt": "hi", "max_tokens": 3})
    assert status == 200
    out1 = node1.stdout()
    assert re.search(
        r"^INFO \d\d-\d\d \S+ \[serve.py:212\] Launching vLLM \(v0.26.0\) headless multiproc executor, with head node "
        rf"address 127.0.0.1:{store} for torch.distributed process group.$",
        out1,
        re.M,
    )  # run_headless decorates nothing: the main process's lines have no prefix
    assert "world_size=2 rank=1 local_rank=0" in out1 and "(Worker_TP1 pid=" in out1
    titles = sorted(p.cmdline()[0] for p in psutil.Process(node1.proc.pid).children() if p.cmdline())
    assert "VLLM::Worker_TP1" in titles and not any("EngineCore" in t for t in titles)
    assert not listening(node1.port) and not node1.accepts()
    assert "(Worker_TP1" not in head.stdout()  # the head runs rank 0 only
