"""The suite's port source: each parallel worker draws from its own slice below the ephemeral range."""

from __future__ import annotations

import socket

import freeport
import pytest


def test_workers_get_disjoint_slices_below_the_ephemeral_range() -> None:
    slices = [freeport.worker_slice(f"gw{i}", 4, 32768) for i in range(4)]
    assert all(s is not None for s in slices)
    ports = [set(s) for s in slices if s is not None]
    assert all(not (a & b) for i, a in enumerate(ports) for b in ports[i + 1 :])
    assert min(min(p) for p in ports) == freeport.LOWEST and max(max(p) for p in ports) < 32768


@pytest.mark.parametrize(
    ("worker", "count", "low", "expected"),
    [
        ("", 1, 32768, range(10000, 32768)),  # not under xdist: the whole space
        ("gw1", 2, 32768, range(21384, 32768)),
        ("gw0", 1, 10100, None),  # an ephemeral range that starts low: too little room, bind(0) instead
        ("gw5", 4, 32768, None),  # a worker beyond the count it was told (never, but not a crash)
        ("master", 4, 32768, range(10000, 15692)),
    ],
)
def test_slice_edges(worker: str, count: int, low: int, expected: range | None) -> None:
    assert freeport.worker_slice(worker, count, low) == expected


def test_ports_are_bindable_never_repeated_and_in_this_workers_slice(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw2")
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "3")
    mine = freeport.worker_slice("gw2", 3, freeport._ephemeral_low())
    assert mine is not None
    got = [freeport.free_port() for _ in range(50)]
    assert len(set(got)) == 50 and all(p in mine for p in got)
    for p in got:
        with socket.socket() as s:
            s.bind(("127.0.0.1", p))  # free when handed out (nothing here holds it)


def test_a_taken_port_is_never_handed_out(monkeypatch: pytest.MonkeyPatch) -> None:
    holders = []
    for _ in range(3):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        holders.append(s)
    taken = {s.getsockname()[1] for s in holders}
    monkeypatch.setattr(freeport, "worker_slice", lambda *_: range(min(taken), min(taken) + 1))
    try:
        port = freeport.free_port()  # the one-port slice is taken: falls back to the kernel's choice
        assert port not in taken
    finally:
        for s in holders:
            s.close()
