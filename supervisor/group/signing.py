"""Who a peer is: per-node keys from one group secret, and signed requests and answers (issue 33).

Every node's key is `HMAC-SHA256(group secret, "sglang-supervisor group node <rank>")`. The leader
holds the group secret (it talks to every node); a member needs only its own key (`[group]
key_file`, printed by `sglang-supervisor group-key`) or the secret. The operator's bearer token is
never sent between daemons.

A request from the leader to member N is signed with N's key; member N's answer is signed with the
same key over its status, its body and the request's nonce, so an answer is bound to the request it
answers and comes from the holder of N's key. Both sides refuse a timestamp outside `max_skew_s`;
a member refuses a nonce it has already seen (`NonceBook`). Pure but for `os.urandom`.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass

NODE = "x-group-node"
TIME = "x-group-time"
NONCE = "x-group-nonce"
SIGNATURE = "x-group-signature"
HEADERS = (NODE, TIME, NONCE, SIGNATURE)
_LABEL = b"sglang-supervisor group node "
NONCE_BYTES = 16
MAX_ANSWER_BYTES = 1 << 20  # a member's answer is a small JSON document: 1 MiB is far beyond any


def node_key(secret: bytes, node: int) -> bytes:
    """Node `node`'s key, derived from the group secret."""
    return hmac.new(secret, _LABEL + str(node).encode(), hashlib.sha256).digest()


def new_nonce() -> str:
    return os.urandom(NONCE_BYTES).hex()


def _message(kind: str, method: str, path: str, node: int, at: str, nonce: str, body: bytes, status: int) -> bytes:
    digest = hashlib.sha256(body).hexdigest()
    return "\n".join((kind, method.upper(), path, str(node), at, nonce, str(status), digest)).encode()


def sign(
    key: bytes, kind: str, method: str, path: str, node: int, at: str, nonce: str, body: bytes, status: int = 0
) -> str:
    return hmac.new(key, _message(kind, method, path, node, at, nonce, body, status), hashlib.sha256).hexdigest()


@dataclass(frozen=True)
class Signed:
    """The four headers of a signed request or answer."""

    node: int
    at: str
    nonce: str
    signature: str

    def headers(self) -> dict[str, str]:
        return {NODE: str(self.node), TIME: self.at, NONCE: self.nonce, SIGNATURE: self.signature}


def sign_request(key: bytes, node: int, method: str, path: str, body: bytes, wall: float) -> Signed:
    at, nonce = f"{wall:.3f}", new_nonce()
    return Signed(node, at, nonce, sign(key, "request", method, path, node, at, nonce, body))


def sign_answer(
    key: bytes, node: int, method: str, path: str, nonce: str, status: int, body: bytes, wall: float
) -> Signed:
    at = f"{wall:.3f}"
    return Signed(node, at, nonce, sign(key, "answer", method, path, node, at, nonce, body, status))


def read_signed(headers: Mapping[str, str]) -> Signed | str:
    """The signature headers, or why they are missing or malformed."""
    missing = [h for h in HEADERS if not headers.get(h)]
    if missing:
        return f"not signed (no {', '.join(missing)})"
    node, at, nonce, sig = (headers[h].strip() for h in HEADERS)
    if not node.isdigit() or len(node) > 6:
        return "malformed signature: node"
    try:
        float(at)
    except ValueError:
        return "malformed signature: time"
    if len(nonce) != 2 * NONCE_BYTES or any(c not in "0123456789abcdef" for c in nonce):
        return "malformed signature: nonce"
    if len(sig) != 64:
        return "malformed signature: signature"
    return Signed(int(node), at, nonce, sig)


def _fresh(at: str, wall: float, max_skew_s: float) -> str:
    skew = wall - float(at)
    if abs(skew) > max_skew_s:
        return f"stale signature ({skew:+.0f} s from this clock, more than max_skew_s {max_skew_s:g})"
    return ""


def check_answer(
    key: bytes,
    node: int,
    method: str,
    path: str,
    nonce: str,
    status: int,
    body: bytes,
    headers: Mapping[str, str],
    wall: float,
    max_skew_s: float,
) -> str:
    """Empty when the answer is member `node`'s to the request with `nonce`; else why not."""
    s = read_signed(headers)
    if isinstance(s, str):
        return f"answer {s}"
    if s.node != node:
        return f"answer signed as node {s.node}, asked node {node}"
    if not hmac.compare_digest(s.nonce, nonce):
        return "answer to another request (nonce differs)"
    if not hmac.compare_digest(s.signature, sign(key, "answer", method, path, node, s.at, nonce, body, status)):
        return "answer signature does not verify (not this node's key)"
    return _fresh(s.at, wall, max_skew_s)


class NonceBook:
    """The nonces seen within the skew window: a replayed request is refused. Bounded: the oldest
    go first beyond `cap` (a request older than the window is refused as stale anyway)."""

    def __init__(self, window_s: float, monotonic: Callable[[], float], cap: int = 100_000) -> None:
        self.window_s = window_s
        self._monotonic = monotonic
        self._cap = cap
        self._seen: OrderedDict[str, float] = OrderedDict()

    def first_time(self, nonce: str) -> bool:
        now = self._monotonic()
        while self._seen:
            at = next(iter(self._seen.values()))
            if now - at <= 2 * self.window_s and len(self._seen) < self._cap:
                break
            self._seen.popitem(last=False)
        if nonce in self._seen:
            return False
        self._seen[nonce] = now
        return True


@dataclass
class RequestCheck:
    """A daemon's check of the requests it takes: signed as one of `signers` with that node's key,
    fresh, not replayed. A member takes the leader's requests, signed with the member's own key
    (only the leader and the member hold it); the leader takes its members' joins, each signed
    with the joining node's key."""

    key_for: Callable[[int], bytes]
    signers: frozenset[int]
    max_skew_s: float
    nonces: NonceBook

    def __call__(self, method: str, path: str, body: bytes, headers: Mapping[str, str], wall: float) -> Signed | str:
        s = read_signed(headers)
        if isinstance(s, str):
            return s
        if s.node not in self.signers:
            return f"signed as node {s.node}; this daemon takes requests signed as node(s) {sorted(self.signers)}"
        key = self.key_for(s.node)
        if not hmac.compare_digest(s.signature, sign(key, "request", method, path, s.node, s.at, s.nonce, body)):
            return "signature does not verify (not this group's key)"
        stale = _fresh(s.at, wall, self.max_skew_s)
        if stale:
            return stale
        if not self.nonces.first_time(s.nonce):
            return "replayed request (nonce already seen)"
        return s
