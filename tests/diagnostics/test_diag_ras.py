"""NCCL RAS client against a real TCP server speaking the protocol (tests/support/fake_ras.py)."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import pytest
from fake_ras import FakeRas, comm, report

from supervisor.diagnostics.capturerecords import Classification
from supervisor.diagnostics.ras import query_ras, ras_address
from supervisor.diagnostics.rasview import collective_doc, findings, ras_doc, with_ras


@pytest.fixture
def servers() -> Iterator[list[FakeRas]]:
    made: list[FakeRas] = []
    yield made
    for s in made:
        s.close()


def _serve(servers: list[FakeRas], body: str, mode: str = "ok") -> FakeRas:
    s = FakeRas(lambda: body, mode)  # type: ignore[arg-type]
    servers.append(s)
    return s


def test_a_report_is_read_and_the_protocol_followed(servers: list[FakeRas]) -> None:
    s = _serve(servers, report([comm([101, 102])]))
    r = query_ras(s.address, 3.0)
    assert r.status == "ok" and r.nccl_version == "2.28.9", r
    assert s.requests == ["CLIENT PROTOCOL 2", "TIMEOUT 2", "SET FORMAT json", "STATUS"]
    (c,) = r.communicators
    assert [x.pid for x in c.ranks] == [101, 102] and c.missing == ()
    assert findings(r, [101, 102]) == ()  # all present, counts agree


def test_a_missing_and_a_lagging_rank_are_named(servers: list[FakeRas]) -> None:
    body = report([comm([101, 102], missing=[(2, 103)], counts=[8, 7])])
    r = query_ras(_serve(servers, body).address, 3.0)
    (f,) = findings(r, [101, 102, 103])
    assert f.missing == ("rank 2 pid 103 (unresponsive)",) and f.missing_ranks == (2,)
    assert f.behind == ("rank 1 pid 102: AllReduce 7 of 8",) and f.operation == "AllReduce"
    idle = Classification("idle_deadlock", ("every thread waits",), (), ("idle_deadlock",))
    cls = with_ras(idle, findings(r, [101]))
    assert cls.hang_class == "collective" and cls.reasons[0].startswith("NCCL RAS: communicator 0x1234abcd")
    doc = collective_doc(cls, findings(r, [101]))
    assert doc["source"] == "ras" and doc["missing_ranks"] == [2] and doc["operation"] == "AllReduce"


def test_another_jobs_communicators_are_not_ours(servers: list[FakeRas]) -> None:
    body = report([comm([101, 102]), comm([901, 902], missing=[(2, 903)])])
    r = query_ras(_serve(servers, body).address, 3.0)
    assert findings(r, [101, 102]) == ()
    doc = ras_doc(r, [101, 102])
    assert doc["communicators"] == 1 and doc["other_communicators"] == 1


def test_frames_are_the_source_when_ras_has_nothing() -> None:
    cls = Classification("collective", ("ranks [0] wait in the collective; [1] never joined it",), (), ())
    assert collective_doc(cls, ())["source"] == "frames"
    idle = Classification("idle_deadlock", (), (), ())
    assert collective_doc(idle, ())["source"] is None


def test_nothing_listening_is_absent_not_an_error() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, never listening: refused
        r = query_ras(f"127.0.0.1:{port}", 2.0)
    assert r.status == "absent" and "NCCL older than 2.24" in r.reason


@pytest.mark.parametrize(
    ("mode", "status", "words"),
    [
        ("garbage", "error", "not NCCL's RAS protocol"),
        ("no_json", "error", "no JSON format"),
        ("bad_json", "error", "not NCCL's JSON report"),
    ],
)
def test_garbage_is_an_error_with_a_reason(servers: list[FakeRas], mode: str, status: str, words: str) -> None:
    r = query_ras(_serve(servers, report([comm([1])]), mode).address, 3.0)
    assert r.status == status and words in r.reason, r


@pytest.mark.integration  # waits out the query's timeout
@pytest.mark.parametrize("mode", ["hang", "hang_report"])
def test_a_hung_service_costs_the_timeout_and_no_more(servers: list[FakeRas], mode: str) -> None:
    s = _serve(servers, report([comm([1])]), mode)
    tic = time.monotonic()
    r = query_ras(s.address, 1.0)
    took = time.monotonic() - tic
    assert r.status == "timeout" and took < 3.0, (r, took)


def test_the_address_comes_from_the_environment() -> None:
    assert ras_address({}) == "localhost:28028"
    assert ras_address({"NCCL_RAS_ADDR": "127.0.0.1:29000"}) == "127.0.0.1:29000"
    assert query_ras("no-port-here", 1.0).status == "error"
