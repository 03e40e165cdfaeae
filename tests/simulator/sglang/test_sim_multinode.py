"""Several simulated nodes of one TP group on this machine: real processes, a real rendezvous port,
real collectives over TCP between the nodes' ranks, and each node's own faults."""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

import psutil
import pytest
from freeport import free_port

if TYPE_CHECKING:
    from conftest import Sim, SimStarter

pytestmark = pytest.mark.integration

READY = "The server is fired up and ready to roll!"
INIT_BEGIN = "Init torch distributed begin."
INIT_ENDS = "Init torch distributed ends."
DUMMY = "Dummy health check server started in background thread at 127.0.0.1:"


def alive(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def listeners(port: int) -> list[int]:
    return [c.pid for c in psutil.net_connections("tcp") if c.laddr and c.laddr.port == port and c.status == "LISTEN"]


def titles(s: Sim) -> list[str]:
    """SGLang's named children (multiprocessing's resource tracker aside)."""
    out = []
    for child in s.children():
        try:
            title = child.cmdline()[0]
        except (psutil.Error, IndexError):
            continue
        if title.startswith("sglang::"):
            out.append(title)
    return sorted(out)


def node(
    sim: SimStarter, rank: int, nnodes: int, store: int, tp: int, scenario: str = "ok", *flags: str, **kw: object
) -> Sim:
    args = ("--nnodes", str(nnodes), "--node-rank", str(rank), "--dist-init-addr", f"127.0.0.1:{store}", *flags)
    return sim(scenario, *args, tp=tp, **kw)


def group(sim: SimStarter, nnodes: int, tp: int, *flags: str, store: int | None = None) -> tuple[int, list[Sim]]:
    store = store or free_port()
    return store, [node(sim, r, nnodes, store, tp, "ok", *flags) for r in range(nnodes)]


def ready(nodes: list[Sim], timeout: float = 30.0) -> None:
    """Node 0 fired up, every other node's dummy health server up."""
    assert nodes[0].wait_log(READY, timeout), nodes[0].stderr()[-3000:]
    for n in nodes[1:]:
        assert n.wait_log(DUMMY, timeout), n.stderr()[-3000:]


class Load:
    """Clients generating long answers on node 0 until stopped (or until their requests hang)."""

    def __init__(self, s: Sim, clients: int = 2) -> None:
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._client, args=(s,), daemon=True) for _ in range(clients)]
        for t in self.threads:
            t.start()

    def _client(self, s: Sim) -> None:
        while not self.stop.is_set():
            try:
                s.generate(max_new_tokens=400, timeout=60)
            except OSError:
                return


def decode_tokens(s: Sim) -> float:
    return s.metrics().get("sglang:realtime_tokens_total", 0.0)


def advancing(s: Sim, window: float = 1.0) -> bool:
    before = decode_tokens(s)
    time.sleep(window)
    return decode_tokens(s) > before


def scheduler(s: Sim, title: str) -> psutil.Process:
    found = [p for p in s.children() if p.cmdline()[:1] == [title]]
    assert len(found) == 1, titles(s)
    return found[0]


def test_two_nodes_start_as_one_group(sim: SimStarter) -> None:
    store, nodes = group(sim, 2, 4, "--enable-metrics")
    ready(nodes)
    n0, n1 = nodes
    # Global TP ranks on each node, as SGLang names them; node 1 has no tokenizer or detokenizer.
    assert titles(n0) == ["sglang::detokenizer", "sglang::scheduler_TP0", "sglang::scheduler_TP1"]
    assert n1.wait_until(lambda: titles(n1) == ["sglang::scheduler_TP2", "sglang::scheduler_TP3"])
    assert "TP2] Init torch distributed ends." in n1.stderr() and "TP3] Load weight end." in n1.stderr()
    assert READY not in n1.stderr() and "Uvicorn running" not in n1.stderr()
    # Rank 0 on node 0 holds the rendezvous, like torch's TCPStore.
    assert listeners(store) == [scheduler(n0, "sglang::scheduler_TP0").pid]
    # Node 0 serves; node 1's dummy server answers /health with nothing to say, and nothing else.
    assert n0.generate(max_new_tokens=8)[0] == 200
    assert n1.request("/health") == (200, b"")
    assert n1.request("/health_generate") == (200, b"")
    assert n1.request("/ping")[0] == 200
    assert n1.request("/get_model_info")[0] == 404
    assert n1.request("/generate", {"text": "hi"})[0] == 404
    assert n1.request("/metrics") == (200, b"")
    assert n1.stdout() == ""  # no access log at uvicorn's warning level


def test_three_nodes_start_and_serve(sim: SimStarter) -> None:
    _, nodes = group(sim, 3, 3, "--enable-metrics")
    ready(nodes)
    assert [titles(n) for n in nodes[1:]] == [["sglang::scheduler_TP1"], ["sglang::scheduler_TP2"]]
    load = Load(nodes[0])
    assert nodes[0].wait_until(lambda: advancing(nodes[0], 0.5), 10)
    load.stop.set()


def test_a_node_that_never_joins_holds_node_0_at_init(sim: SimStarter) -> None:
    store = free_port()
    n0 = node(sim, 0, 2, store, 2)
    assert n0.wait_log(f"TP0] {INIT_BEGIN}")
    quiet_from = len(n0.stderr())
    time.sleep(3.0)
    log = n0.stderr()
    assert INIT_ENDS not in log and log[quiet_from:] == ""  # waiting prints nothing
    assert n0.proc.poll() is None and not n0.accepts()
    assert listeners(store) == [scheduler(n0, "sglang::scheduler_TP0").pid]
    # The node arrives late: the group forms and node 0 serves.
    n1 = node(sim, 1, 2, store, 2)
    ready([n0, n1])


def test_the_rendezvous_times_out_as_torch_does(sim: SimStarter) -> None:
    store = free_port()
    n0 = node(sim, 0, 2, store, 2, "ok", "--dist-timeout", "2")
    assert n0.proc.wait(20) == -signal.SIGKILL  # the launch-phase SIGQUIT handler kills the tree and itself
    log = n0.stderr()
    assert "torch.distributed.DistStoreError: Timed out after" in log and "1/2 clients joined." in log
    assert "Received sigquit from a child process. It usually means the child failed." in log
    assert INIT_ENDS not in log


def test_a_worker_rank_sigkilled_under_load_stalls_node_0(sim: SimStarter) -> None:
    _, (n0, n1) = group(sim, 2, 2, "--enable-metrics", "--decode-log-interval", "5")
    ready([n0, n1])
    load = Load(n0)
    assert n0.wait_until(lambda: advancing(n0, 0.5), 10)
    assert n0.wait_log("TP0] Decode batch, #running-req: 2,")
    victim = scheduler(n1, "sglang::scheduler_TP1")
    victim.kill()
    time.sleep(1.0)  # the forward in flight finishes or not; from here nothing moves
    decode_lines = n0.stderr().count("Decode batch")
    assert not advancing(n0, 2.0)
    assert n0.stderr().count("Decode batch") == decode_lines
    assert n0.metrics()["sglang:num_running_reqs"] > 0  # requests still running: a serving stall
    assert n0.proc.poll() is None and alive(scheduler(n0, "sglang::scheduler_TP0"))  # node 0 does not exit
    assert n0.request("/get_model_info")[0] == 200
    # Node 1 had one rank: its main falls out of wait_for_completion into an HTTP start-up that fails.
    assert n1.proc.wait(10) == 3
    assert f"Scheduler or DataParallelController {victim.pid} terminated with -9" in n1.stderr()
    assert "Application startup failed. Exiting." in n1.stderr()
    load.stop.set()


def gpu_util(path: Path) -> float:
    return float(json.loads(path.read_text())["devices"][0]["util"])


def test_a_worker_rank_sigstopped_under_load_stalls_node_0_until_continued(sim: SimStarter, tmp_path: Path) -> None:
    nvml = tmp_path / "node0-nvml.json"
    nvml.write_text(json.dumps({"devices": [{"util": 35}]}))
    store = free_port()
    n0 = node(sim, 0, 2, store, 2, "ok", "--enable-metrics", env={"SGLANG_SIM_GPU_FILE": str(nvml)})
    n1 = node(sim, 1, 2, store, 2, "ok", "--enable-metrics")
    ready([n0, n1])
    load = Load(n0)
    assert n0.wait_until(lambda: advancing(n0, 0.5), 10)
    victim = scheduler(n1, "sglang::scheduler_TP1")
    victim.suspend()
    try:
        time.sleep(0.5)
        assert not advancing(n0, 2.0)
        assert n0.proc.poll() is None and n1.proc.poll() is None
        assert n1.request("/health") == (200, b"")  # the dummy server knows nothing of its ranks
        tp0 = scheduler(n0, "sglang::scheduler_TP0")
        assert tp0.status() in (psutil.STATUS_RUNNING, psutil.STATUS_SLEEPING)  # spinning in the collective
        assert n0.wait_until(lambda: gpu_util(nvml) == 100.0, 5)  # node 0's GPU: the all-reduce kernel stuck
    finally:
        victim.resume()
    # The exchange is real: once the rank runs again the collective completes and decoding goes on.
    assert n0.wait_until(lambda: advancing(n0, 0.5), 10)
    assert gpu_util(nvml) == 35.0
    load.stop.set()


def test_node_0_dying_leaves_node_1_hung(sim: SimStarter) -> None:
    _, (n0, n1) = group(sim, 2, 2)
    ready([n0, n1])
    rank1 = scheduler(n1, "sglang::scheduler_TP1")
    os.killpg(n0.proc.pid, signal.SIGKILL)
    n0.proc.wait(5)
    time.sleep(2.0)
    assert n1.proc.poll() is None and alive(rank1)  # nothing tells it: it waits for a step forever
    assert n1.request("/health") == (200, b"")
    assert "terminated with" not in n1.stderr()


def test_a_node_relaunched_alone_waits_at_init_then_the_group_relaunches(sim: SimStarter) -> None:
    store, (n0, n1) = group(sim, 2, 2)
    ready([n0, n1])
    os.killpg(n1.proc.pid, signal.SIGKILL)
    n1.proc.wait(5)
    # Node 1 again, alone, against node 0's old (formed) group: held at the rendezvous, silently.
    again = node(sim, 1, 2, store, 2)
    assert again.wait_log(f"TP1] {INIT_BEGIN}")
    time.sleep(2.5)
    assert INIT_ENDS not in again.stderr() and not again.accepts()
    # The whole group relaunched on the same rendezvous port: the old listener is gone, the port reused.
    for s in (n0, again):
        os.killpg(s.proc.pid, signal.SIGKILL)
        s.proc.wait(5)
    assert n0.wait_until(lambda: listeners(store) == [], 5)
    _, fresh = group(sim, 2, 2, store=store)
    ready(fresh)
    assert fresh[0].generate(max_new_tokens=8)[0] == 200


def test_a_node_relaunched_alone_after_node_0_died_waits_at_init(sim: SimStarter) -> None:
    store, (n0, n1) = group(sim, 2, 2)
    ready([n0, n1])
    for s in (n0, n1):
        os.killpg(s.proc.pid, signal.SIGKILL)
        s.proc.wait(5)
    again = node(sim, 1, 2, store, 2)
    assert again.wait_log(f"TP1] {INIT_BEGIN}")
    time.sleep(2.5)
    assert INIT_ENDS not in again.stderr() and again.proc.poll() is None


def test_node_1s_rank_dies_scenario_hangs_node_0(sim: SimStarter) -> None:
    store = free_port()
    n0 = node(sim, 0, 2, store, 2, "ok", "--enable-metrics")
    n1 = node(sim, 1, 2, store, 2, "rank_dies", env={"SGLANG_SIM_FAULT_AFTER_S": "1.5"})
    ready([n0, n1])
    load = Load(n0)
    assert n1.wait_until(lambda: n1.proc.poll() is not None, 15)
    assert "Fatal Python error: Segmentation fault" in n1.stderr()
    assert n1.onset()["scenario"] == "rank_dies"
    time.sleep(1.0)
    assert not advancing(n0, 2.0) and n0.proc.poll() is None
    load.stop.set()


def test_node_1s_startup_deadlock_holds_node_0_in_capture(sim: SimStarter) -> None:
    store = free_port()
    n0 = node(sim, 0, 2, store, 2)
    n1 = node(sim, 1, 2, store, 2, "deadlock_after_load")
    assert n1.wait_log("TP1] KV Cache is allocated")
    assert n0.wait_log("TP0] Capture target decode CUDA graph begin.")
    time.sleep(2.0)
    assert "Capture target decode CUDA graph end." not in n0.stderr() and not n0.accepts()
    assert n0.proc.poll() is None


def test_tp_size_must_divide_by_nnodes(sim: SimStarter) -> None:
    s = node(sim, 0, 2, free_port(), 3)
    assert s.proc.wait(20) == 1
    assert "AssertionError: tp_size must be divisible by number of nodes" in s.stderr()


def test_node_0s_health_fails_after_the_timeout_when_a_worker_rank_died(sim: SimStarter) -> None:
    store = free_port()
    n0 = node(sim, 0, 2, store, 2, "ok", env={"SGLANG_HEALTH_CHECK_TIMEOUT": "2"})
    n1 = node(sim, 1, 2, store, 2)
    ready([n0, n1])
    assert n0.request("/health")[0] == 200
    scheduler(n1, "sglang::scheduler_TP1").kill()
    tic = time.monotonic()
    assert n0.request("/health", timeout=15)[0] == 503  # the health generate never comes back
    assert time.monotonic() - tic >= 1.5
    assert "Health check failed. Server couldn't get a response from detokenizer for last 2" in n0.stderr()
    assert n0.request("/model_info")[0] == 200 and n0.proc.poll() is None


def test_node_1s_crash_after_ready_ends_node_1_and_hangs_node_0(sim: SimStarter) -> None:
    store = free_port()
    n0 = node(sim, 0, 2, store, 2, "ok", "--enable-metrics")
    n1 = node(sim, 1, 2, store, 2, "crash_after_ready", env={"SGLANG_SIM_FAULT_AFTER_S": "1"})
    ready([n0, n1])
    assert n1.proc.wait(15) == -signal.SIGKILL  # the launch-phase handler kills the tree and itself
    log = n1.stderr()
    assert "TP1] Scheduler hit an exception:" in log and "illegal memory access" in log
    assert "Received sigquit from a child process. It usually means the child failed." in log
    load = Load(n0)
    time.sleep(1.0)
    assert not advancing(n0, 1.5) and n0.proc.poll() is None
    assert n0.onset()["scenario"] == "ok" and n1.onset()["scenario"] == "crash_after_ready"
    load.stop.set()


def test_node_1s_serving_stall_stops_node_0s_decode(sim: SimStarter) -> None:
    store = free_port()
    n0 = node(sim, 0, 2, store, 2, "ok", "--enable-metrics")
    n1 = node(sim, 1, 2, store, 2, "serving_stall", env={"SGLANG_SIM_FAULT_AFTER_S": "1"})
    ready([n0, n1])
    assert n1.wait_until(lambda: n1.onset_path.exists() and n1.onset().get("onset_wall") is not None, 10)
    load = Load(n0)
    time.sleep(1.5)
    assert not advancing(n0, 1.5)
    assert n1.onset()["writer_pid"] == scheduler(n1, "sglang::scheduler_TP1").pid  # node 1's rank stalled
    assert n0.proc.poll() is None and n1.proc.poll() is None
    load.stop.set()


def test_a_worker_ranks_own_watchdog_ends_its_node(sim: SimStarter) -> None:
    """Three nodes; node 2's rank stopped under load: node 1's rank waits inside the collective until
    SGLang's scheduler watchdog fires there, and node 1's main kills its tree."""
    store = free_port()
    nodes = [node(sim, r, 3, store, 3, "ok", "--watchdog-timeout", "2", "--enable-metrics") for r in range(3)]
    ready(nodes)
    load = Load(nodes[0])
    assert nodes[0].wait_until(lambda: advancing(nodes[0], 0.5), 10)
    stopped = scheduler(nodes[2], "sglang::scheduler_TP2")
    stopped.suspend()
    try:
        assert nodes[1].proc.wait(30) == -signal.SIGKILL
        log = nodes[1].stderr()
        assert "TP1] Scheduler watchdog timeout (self.watchdog_timeout=2.0, self.soft=False)" in log
        assert "Received sigquit from a child process. It usually means the child failed." in log
    finally:
        stopped.resume()
    load.stop.set()


def test_a_dummy_health_port_in_use_leaves_the_node_without_one(sim: SimStarter) -> None:
    store = free_port()
    n0 = node(sim, 0, 2, store, 2)
    n1 = node(sim, 1, 2, store, 2)
    with socket.socket() as squatter:
        squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        squatter.bind(("127.0.0.1", n1.port))
        squatter.listen(1)
        assert n0.wait_log(READY, 30)
        assert n1.wait_log("Dummy health check server stopped at 127.0.0.1:", 30)
        assert "error while attempting to bind on address ('127.0.0.1'," in n1.stderr()
        assert n1.proc.poll() is None  # its ranks still serve the group
        assert n0.generate(max_new_tokens=8)[0] == 200


def test_a_worker_node_alone_times_out_at_the_rendezvous(sim: SimStarter) -> None:
    n1 = node(sim, 1, 2, free_port(), 2, "ok", "--dist-timeout", "2")
    assert n1.proc.wait(20) == -signal.SIGKILL
    log = n1.stderr()
    assert "TP1] Scheduler hit an exception:" in log
    assert "torch.distributed.DistNetworkError: The client socket has timed out after 2000ms" in log
    assert "Received sigquit from a child process." in log and DUMMY not in log


def test_a_worker_rank_dying_at_init_is_reported_and_the_others_awaited(sim: SimStarter) -> None:
    """0.5.16: the ready wait polls every 5 s, raises for the dead rank, and Python's exit then joins
    the node's other schedulers (non-daemon), which wait at the rendezvous."""
    n1 = node(sim, 1, 2, free_port(), 4)
    assert n1.wait_log(f"TP3] {INIT_BEGIN}") and n1.wait_log(f"TP2] {INIT_BEGIN}")
    scheduler(n1, "sglang::scheduler_TP3").kill()
    assert n1.wait_log("RuntimeError: Rank 1 scheduler died during initialization (exit code: -9).", 15)
    assert n1.proc.poll() is None and alive(scheduler(n1, "sglang::scheduler_TP2"))  # joined, not killed
    scheduler(n1, "sglang::scheduler_TP2").kill()
    assert n1.proc.wait(10) == 1


def test_sigterm_ends_a_worker_node_and_its_ranks(sim: SimStarter) -> None:
    _, (n0, n1) = group(sim, 2, 4)
    ready([n0, n1])
    ranks = [scheduler(n1, t) for t in ("sglang::scheduler_TP2", "sglang::scheduler_TP3")]
    n1.proc.send_signal(signal.SIGTERM)  # the main only: no handler on a worker node
    assert n1.proc.wait(5) == -signal.SIGTERM
    assert n1.wait_until(lambda: not any(alive(r) for r in ranks), 5)  # PDEATHSIG
    assert n0.proc.poll() is None


def test_node_1s_crash_on_load_ends_both_nodes_through_gloo(sim: SimStarter) -> None:
    """Node 1's rank dies while loading; node 0's rank then meets the memory profile's CPU-group
    all-reduce, where gloo (unlike NCCL) notices the closed connection and raises."""
    store = free_port()
    n0 = node(sim, 0, 2, store, 2)
    n1 = node(sim, 1, 2, store, 2, "crash_on_load")
    assert n1.proc.wait(30) == 1
    log = n1.stderr()
    assert "TP1] Scheduler hit an exception:" in log and "torch.OutOfMemoryError: CUDA out of memory." in log
    assert "RuntimeError: Rank 0 scheduler died during initialization (exit code: 1)." in log
    assert n0.proc.wait(30) == -signal.SIGKILL
    log0 = n0.stderr()
    assert "TP0] Scheduler hit an exception:" in log0 and "Connection closed by peer" in log0
    assert "Received sigquit from a child process." in log0 and READY not in log0


def test_node_1s_health_hangs_makes_node_0s_health_fail(sim: SimStarter) -> None:
    store = free_port()
    n0 = node(sim, 0, 2, store, 2, "ok", env={"SGLANG_HEALTH_CHECK_TIMEOUT": "2"})
    n1 = node(sim, 1, 2, store, 2, "health_hangs", env={"SGLANG_SIM_FAULT_AFTER_S": "1"})
    ready([n0, n1])
    assert n1.wait_until(lambda: n1.onset_path.exists() and n1.onset().get("onset_wall") is not None, 10)
    assert n0.request("/health", timeout=15)[0] == 503
    assert n1.request("/health") == (200, b"") and n1.proc.poll() is None


def test_three_nodes_a_rank_killed_on_the_last_node_hangs_the_other_two(sim: SimStarter) -> None:
    _, nodes = group(sim, 3, 3, "--enable-metrics")
    ready(nodes)
    load = Load(nodes[0])
    assert nodes[0].wait_until(lambda: advancing(nodes[0], 0.5), 10)
    middle = scheduler(nodes[1], "sglang::scheduler_TP1")
    scheduler(nodes[2], "sglang::scheduler_TP2").kill()
    assert nodes[2].proc.wait(10) == 3
    time.sleep(1.0)
    assert not advancing(nodes[0], 2.0)
    assert nodes[0].proc.poll() is None and nodes[1].proc.poll() is None and alive(middle)  # hung, not gone
    assert nodes[1].request("/health") == (200, b"")
    load.stop.set()
