"""NCCL's RAS service: NCCL's own view of every communicator, asked during a capture and polled by
the RAS detector while a server with communicators starts or serves (issue 35).

NCCL >= 2.24 runs a RAS thread in every process that holds a communicator (SGLang's pynccl ones
included) and answers a line protocol on `localhost:28028` (`NCCL_RAS_ADDR` moves it; NCCL's
src/ras/client.cc): `CLIENT PROTOCOL 2` -> `SERVER PROTOCOL 2`, `TIMEOUT <s>` -> `OK`,
`SET FORMAT json` -> `OK`, `STATUS` -> a JSON document, then the server closes the connection.
The query is blocking socket I/O with one deadline over all of it: run it off the event loop.
Nothing answering is a finding ("absent"), never an error of the capture.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

DEFAULT_ADDR = "localhost:28028"
MAX_BYTES = 4 * 1024 * 1024  # a 1000-rank job's STATUS is well under this; more is not NCCL
NCCL_TIMEOUT_S = 5  # what NCCL gives each leg of its own collective over the RAS network
ABSENT_INTERVAL_S = 10.0  # between asks while nothing listens (a communicator appears at NCCL init)

RasStatus = Literal[
    "ok",  # a report came back and parsed
    "absent",  # nothing listens: NCCL < 2.24, no communicator in the tree, or another address
    "disabled",  # NCCL_RAS_ENABLE=0 in the server's environment: not asked
    "timeout",  # connected, but no complete report within the time allowed
    "error",  # answered something that is not the protocol (garbage, old protocol, bad JSON)
]


@dataclass(frozen=True)
class RasRank:
    rank: int
    pid: int
    host: str
    cuda_dev: int
    nvml_dev: int
    async_error: int = 0
    abort_flag: bool = False
    counts: tuple[tuple[str, int], ...] = ()  # collective operation -> how many this rank ran


@dataclass(frozen=True)
class RasMissing:
    rank: int
    pid: int
    host: str
    cuda_dev: int
    unresponsive: bool
    dead: bool


@dataclass(frozen=True)
class RasComm:
    hash: str
    size: int
    ranks: tuple[RasRank, ...]
    missing: tuple[RasMissing, ...]


@dataclass(frozen=True)
class RasReport:
    status: RasStatus
    address: str
    reason: str = ""
    nccl_version: str | None = None
    communicators: tuple[RasComm, ...] = ()
    raw: str = ""  # the JSON document as NCCL sent it (ras.json)
    duration_s: float = 0.0


def ras_address(env: Mapping[str, str]) -> str:
    return env.get("NCCL_RAS_ADDR") or DEFAULT_ADDR


def _split(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    host = host.strip("[]") or "localhost"
    return ("127.0.0.1" if host == "localhost" else host), int(port)


class _Conn:
    """Line-at-a-time reads with one deadline over the whole conversation."""

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self.sock, self.deadline, self.buf = sock, deadline, b""

    def _recv(self) -> bytes:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError
        self.sock.settimeout(left)
        return self.sock.recv(65536)

    def ask(self, line: str) -> str:
        self.sock.sendall(line.encode() + b"\n")
        while b"\n" not in self.buf:
            chunk = self._recv()
            if not chunk:
                raise ConnectionError(f"closed after {line!r}")
            self.buf += chunk
            if len(self.buf) > 4096:
                raise ValueError(f"no line in reply to {line!r}")
        reply, _, self.buf = self.buf.partition(b"\n")
        return reply.decode("utf-8", "replace").strip()

    def rest(self) -> bytes:
        data = self.buf
        while True:
            chunk = self._recv()
            if not chunk:
                return data
            data += chunk
            if len(data) > MAX_BYTES:
                raise ValueError(f"report larger than {MAX_BYTES} bytes")


def query_ras(address: str, timeout_s: float) -> RasReport:
    """Ask the RAS service at `address` for STATUS in JSON; never raises, never exceeds `timeout_s`
    (plus the scheduler's slack)."""
    start = time.monotonic()
    deadline = start + timeout_s

    def done(status: RasStatus, reason: str = "", raw: str = "") -> RasReport:
        return RasReport(status, address, reason, raw=raw, duration_s=round(time.monotonic() - start, 4))

    try:
        host, port = _split(address)
    except ValueError:
        return done("error", f"NCCL_RAS_ADDR {address!r} is not host:port")
    try:
        sock = socket.create_connection((host, port), timeout=max(0.05, timeout_s))
    except (ConnectionRefusedError, FileNotFoundError):
        why = "NCCL older than 2.24, RAS disabled, or no NCCL communicator in the tree"
        return done("absent", f"nothing listens on {address}: {why}")
    except TimeoutError:
        return done("timeout", f"connecting to {address} took over {timeout_s:.1f} s")
    except OSError as err:
        return done("absent", f"cannot connect to {address}: {err.strerror or err}")
    with sock:
        conn = _Conn(sock, deadline)
        try:
            hello = conn.ask("CLIENT PROTOCOL 2")
            if not hello.startswith("SERVER PROTOCOL"):
                return done("error", f"not NCCL's RAS protocol: answered {hello[:80]!r} to CLIENT PROTOCOL")
            nccl_timeout = max(1, min(NCCL_TIMEOUT_S, int(timeout_s) - 1))
            if (ok := conn.ask(f"TIMEOUT {nccl_timeout}")) != "OK":
                return done("error", f"TIMEOUT refused: {ok[:80]!r}")
            if (ok := conn.ask("SET FORMAT json")) != "OK":
                return done("error", f"no JSON format (NCCL older than 2.27?): {ok[:80]!r}")
            sock.sendall(b"STATUS\n")
            raw = conn.rest().decode("utf-8", "replace")
        except TimeoutError:
            return done("timeout", f"no complete report from {address} within {timeout_s:.1f} s")
        except (OSError, ValueError) as err:
            return done("error", f"{address}: {err}")
    try:
        report = parse_status(raw)
    except (ValueError, TypeError, KeyError) as err:
        return done("error", f"the STATUS reply is not NCCL's JSON report: {err}", raw=raw[:65536])
    return RasReport("ok", address, "", report[0], report[1], raw, round(time.monotonic() - start, 4))


def _int(v: object, default: int = -1) -> int:
    return v if isinstance(v, int) and not isinstance(v, bool) else default


def _rank(d: Mapping[str, object]) -> RasRank:
    status = d.get("status")
    st = status if isinstance(status, dict) else {}
    counts = d.get("collective_counts")
    pairs = tuple((str(k), _int(v, 0)) for k, v in counts.items()) if isinstance(counts, dict) else ()
    return RasRank(
        _int(d.get("rank")),
        _int(d.get("pid")),
        str(d.get("host", "")),
        _int(d.get("cuda_dev")),
        _int(d.get("nvml_dev")),
        _int(st.get("async_error"), 0),
        st.get("abort_flag") is True,
        pairs,
    )


def _missing(d: Mapping[str, object]) -> RasMissing:
    status = d.get("status")
    st = status if isinstance(status, dict) else {}
    return RasMissing(
        _int(d.get("rank")),
        _int(d.get("pid")),
        str(d.get("host", "")),
        _int(d.get("cuda_dev")),
        st.get("unresponsive") is True,
        st.get("considered_dead") is True,
    )


def _list(v: object) -> list[object]:
    return list(v) if isinstance(v, list) else []


def parse_status(raw: str) -> tuple[str | None, tuple[RasComm, ...]]:
    """(nccl_version, communicators) from NCCL's JSON STATUS; raises ValueError on anything else."""
    doc = json.loads(raw)
    if not isinstance(doc, dict) or not isinstance(doc.get("communicators"), list):
        raise ValueError("no 'communicators' list")
    comms = []
    for c in doc["communicators"]:
        if not isinstance(c, dict):
            raise ValueError("a communicator is not an object")
        ranks = _list(c.get("ranks"))
        missing = _list(c.get("missing_ranks"))
        comms.append(
            RasComm(
                str(c.get("hash", "")),
                _int(c.get("size")),
                tuple(_rank(r) for r in ranks if isinstance(r, dict)),
                tuple(_missing(m) for m in missing if isinstance(m, dict)),
            )
        )
    version = doc.get("nccl_version")
    return (str(version) if version is not None else None), tuple(comms)


class RasProbe:
    """Polls the RAS service at most every `interval_s` (the detector's input, issue 35), in a daemon
    thread of its own per query, so that a slow report (NCCL waits 5 s a leg on a dead peer) never
    holds up the daemon's poll nor its exit: `observe` only looks whether the last query finished
    (returning its report once, else None) and starts the next one when due; it never waits.
    Where nothing listens (no NCCL communicator yet, RAS off, NCCL < 2.24) the next ask waits
    `absent_interval_s` instead: a server without NCCL costs one refused connect per that long.
    Never raises. `interval_s` 0: off."""

    def __init__(
        self, address: str, *, interval_s: float, timeout_s: float = 5.0, absent_interval_s: float = ABSENT_INTERVAL_S
    ) -> None:
        self.address, self.interval_s, self.timeout_s = address, interval_s, timeout_s
        self.absent_interval_s = max(interval_s, absent_interval_s)
        self._started: float | None = None
        self._pending: _Query | None = None
        self._last_status: RasStatus | None = None
        self.queries = 0  # how many queries were started (a figure for tests and benches)

    def observe(self, now: float) -> RasReport | None:
        if self.interval_s <= 0:
            return None
        done: RasReport | None = None
        if self._pending is not None and self._pending.report is not None:
            done, self._pending = self._pending.report, None
            self._last_status = done.status
        every = self.absent_interval_s if self._last_status == "absent" else self.interval_s
        if self._pending is None and (self._started is None or now - self._started >= every):
            self._started = now
            self._pending = _Query(self.address, self.timeout_s)
            self.queries += 1
        return done

    def close(self) -> None:
        self._pending = None  # a query under way finishes on its own thread, within its timeout


class _Query:
    """One RAS query on a daemon thread; `report` is set (once, atomically) when it finished."""

    def __init__(self, address: str, timeout_s: float) -> None:
        self.report: RasReport | None = None
        threading.Thread(target=self._run, args=(address, timeout_s), name="ras-probe", daemon=True).start()

    def _run(self, address: str, timeout_s: float) -> None:
        try:
            self.report = query_ras(address, timeout_s)
        except Exception as err:  # query_ras never raises; a bug in it must not kill the detector
            self.report = RasReport("error", address, f"{type(err).__name__}: {err}"[:300])
