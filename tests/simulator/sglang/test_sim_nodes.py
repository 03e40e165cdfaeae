"""Multi-node arithmetic, addresses and the wire format between nodes: no processes."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from supervisor.simulator.argv import parse_args
from supervisor.simulator.links import Done, Go, Hello, Link, decode, encode
from supervisor.simulator.messages import Ack, FiredUp, Step
from supervisor.simulator.modelcard import model_facts
from supervisor.simulator.nodes import TORCH_NCCL_DEFAULT_TIMEOUT_S, layout_error, node_layout, split_addr
from supervisor.simulator.rendezvous import RendezvousError, StoreServer, join_store
from supervisor.simulator.sglang.serverargs import server_args_line


def layout(*flags: str, tp: int = 2) -> object:
    return node_layout(parse_args(["--model-path", "/m", "--tp-size", str(tp), *flags]))


def test_flags_parse_as_sglang_spells_them() -> None:
    args = parse_args(["--model-path", "/m", "--nnodes", "2", "--node-rank", "1", "--nccl-init-addr", "10.0.0.1:20000"])
    assert (args.nnodes, args.node_rank, args.dist_init_addr) == (2, 1, "10.0.0.1:20000")
    assert args.unknown_flags == ()  # known flags, not passed through
    line = server_args_line(args, model_facts(args))
    assert "dist_init_addr='10.0.0.1:20000', nnodes=2, node_rank=1," in line
    plain = parse_args(["--model-path", "/m"])
    assert (plain.nnodes, plain.node_rank, plain.dist_init_addr) == (1, 0, None)


@pytest.mark.parametrize(
    ("tp", "nnodes", "rank", "ranks", "victim"),
    [
        (2, 2, 0, [0], 0),
        (2, 2, 1, [1], 1),
        (4, 2, 1, [2, 3], 3),
        (16, 2, 1, list(range(8, 16)), 9),
        (3, 3, 2, [2], 2),
        (4, 1, 0, [0, 1, 2, 3], 1),  # one node: TP1 dies, as rank_dies always did
        (1, 1, 0, [0], 0),
    ],
)
def test_global_ranks_per_node(tp: int, nnodes: int, rank: int, ranks: list[int], victim: int) -> None:
    lay = node_layout(
        parse_args(["--model-path", "/m", "--tp", str(tp), "--nnodes", str(nnodes), "--node-rank", str(rank)])
    )
    assert list(lay.local_ranks) == ranks and lay.first_local == ranks[0] and lay.victim() == victim
    assert lay.multinode == (nnodes > 1)


def test_layout_errors_and_timeout() -> None:
    bad = node_layout(parse_args(["--model-path", "/m", "--tp", "3", "--nnodes", "2"]))
    assert layout_error(bad) == "tp_size must be divisible by number of nodes"
    good = node_layout(parse_args(["--model-path", "/m", "--tp", "4", "--nnodes", "2", "--dist-timeout", "30"]))
    assert layout_error(good) is None and good.timeout_s == 30.0
    assert node_layout(parse_args(["--model-path", "/m"])).timeout_s == TORCH_NCCL_DEFAULT_TIMEOUT_S == 600.0
    # A node rank beyond the group still meets at the rendezvous, where torch refuses it.
    assert node_layout(parse_args(["--model-path", "/m", "--node-rank", "1"])).multinode


@pytest.mark.parametrize(
    ("addr", "parsed"),
    [
        ("127.0.0.1:20000", ("127.0.0.1", 20000)),
        ("leader.svc:20000", ("leader.svc", 20000)),
        ("[::1]:20000", ("::1", 20000)),
        (" 10.0.0.1:1 ", ("10.0.0.1", 1)),
        ("10.0.0.1", None),
        (":20000", None),
        ("10.0.0.1:0", None),
        ("10.0.0.1:70000", None),
        ("10.0.0.1:port", None),
    ],
)
def test_split_addr(addr: str, parsed: tuple[str, int] | None) -> None:
    assert split_addr(addr) == parsed


def test_wire_messages_round_trip_and_junk_is_ignored() -> None:
    for message in (Hello(3, 4), Go(), Step("decode"), Step("prefill"), Ack(2), FiredUp(), Done()):
        assert decode(encode(message).rstrip(b"\n")) == message
    for junk in (b"", b"not json", b"[1]", b'{"t": "hello", "rank": "x"}', b'{"t": "step", "kind": "rm -rf"}', b"{}"):
        assert decode(junk) is None


def test_link_skips_junk_and_reports_eof() -> None:
    a, b = socket.socketpair()
    link = Link(a)
    b.sendall(b"garbage\n" + encode(Ack(1)) + b'{"t": "done"}')
    assert link.poll(1.0) and link.recv() == Ack(1)
    assert not link.poll(0.05)  # half a line is not a message
    b.sendall(b"\n")
    assert link.recv() == Done()
    b.close()
    assert link.poll(1.0)
    with pytest.raises(EOFError):
        link.recv()
    link.close()


def test_a_line_without_end_is_cut_off() -> None:
    a, b = socket.socketpair()
    link = Link(a)
    b.sendall(b"x" * (70 * 1024))
    assert link.poll(1.0)
    with pytest.raises(EOFError):
        link.recv()
    b.close()
    link.close()


@pytest.mark.integration  # waits out a rendezvous timeout
def test_store_forms_the_group_and_holds_latecomers() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    store = StoreServer("127.0.0.1", port, 3)
    joined: list[Link] = []
    threads = [
        threading.Thread(target=lambda r=r: joined.append(join_store("127.0.0.1", port, r, 3, 10.0))) for r in (1, 2)
    ]
    for t in threads:
        t.start()
    links = store.wait_for_world(time.monotonic() + 10)
    for t in threads:
        t.join(10)
    assert len(links) == 2 and len(joined) == 2
    with pytest.raises(RendezvousError, match="wait timeout after 1000ms"):
        join_store("127.0.0.1", port, 1, 3, 1.0)  # the group formed: a relaunched rank is never answered
    for link in [*links, *joined]:
        link.close()
    store.close()


@pytest.mark.integration  # waits out a rendezvous timeout
def test_store_times_out_waiting_for_clients() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    store = StoreServer("127.0.0.1", port, 2)
    # A stranger claiming rank 0, or saying nothing useful, does not count as a member.
    with socket.create_connection(("127.0.0.1", port)) as stranger:
        stranger.sendall(b'{"t": "hello", "rank": 0, "world_size": 2}\nnonsense\n')
        with pytest.raises(RendezvousError, match=r"Timed out after \d+ seconds waiting for clients. 1/2 clients"):
            store.wait_for_world(time.monotonic() + 0.5)
    store.close()


def test_store_port_in_use_is_torchs_error() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        with pytest.raises(RendezvousError, match=r"failed to listen on any local network address.*EADDRINUSE"):
            StoreServer("127.0.0.1", port, 2)


@pytest.mark.integration  # waits out a rendezvous timeout
def test_a_client_with_no_store_times_out() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    tic = time.monotonic()
    with pytest.raises(RendezvousError, match="client socket has timed out after 500ms"):
        join_store("127.0.0.1", port, 1, 2, 0.5)
    assert time.monotonic() - tic < 3
